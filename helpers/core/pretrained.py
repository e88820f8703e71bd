"""The released GPT-2 weights in the course's model.

OpenAI released GPT-2 in four sizes ("gpt2" 124M, "gpt2-medium", "gpt2-large", "gpt2-xl"); the
Hugging Face hub hosts them (model card: https://huggingface.co/openai-community/gpt2; the
reference implementation: transformers' ``models/gpt2/modeling_gpt2.py``). :func:`load_gpt2` reads
one into :class:`helpers.core.model.GPT`, whose module names are GPT-2's own, so the mapping is
short:

- Names: a checkpoint saved from ``GPT2LMHeadModel`` (what ``save_pretrained`` writes) names its
  tensors ``transformer.h.0.attn.c_attn.weight``, ...: the course's names exactly. The original
  hub files were saved from ``GPT2Model`` and lack the ``transformer.`` prefix
  (``h.0.attn.c_attn.weight``, ``wte.weight``): it is added. ``lm_head.weight`` is the token
  embedding again (weight tying), often left out of the file; when present it must equal ``wte``.
  ``h.N.attn.bias`` / ``h.N.attn.masked_bias`` (causal-mask buffers older transformers saved) are
  not weights and are skipped.
- Conv1D: OpenAI's TensorFlow code stored each projection as an (in, out) matrix and computed
  ``x @ W + b``; transformers keeps that layout (its ``Conv1D``), ``nn.Linear`` stores (out, in)
  and computes ``x @ W.T + b``. So four weights per block are transposed: ``attn.c_attn`` (C, 3C)
  -> (3C, C), ``attn.c_proj`` (C, C), ``mlp.c_fc`` (C, 4C) -> (4C, C), ``mlp.c_proj`` (4C, C) ->
  (C, 4C). The square ``attn.c_proj`` would load untransposed without a shape error: only the
  logits' equality with transformers' model (tests/test_pretrained.py) catches that.
- Padded vocabulary (``vocab_multiple=64``: 50257 -> 50304 rows, chapter 07): the 47 extra rows
  of the tied embedding / LM head are zeros, so a padded id gets logit exactly 0. GPT-2 was never
  trained against those ids and nothing keeps its real logits above 0, so a 0 can beat every real
  id: :meth:`GPT.generate` sets padded logits to -inf before sampling, and the loaded model's loss
  counts only the real vocabulary (:func:`real_vocab_cross_entropy`), so it equals transformers'.

Where the weights come from: a folder (``config.json`` plus ``model.safetensors``, its shards, or
``pytorch_model.bin``) is read directly, without transformers (safetensors files need the
``safetensors`` package; ``pytorch_model.bin`` needs torch only). A hub name (``"gpt2"``,
``"openai-community/gpt2-medium"``) is downloaded with ``huggingface_hub`` into its cache (both
packages come with ``pip install transformers``); with ``HF_HUB_OFFLINE=1`` only that cache is
read. Weights are copied in fp32 whatever dtype the file holds.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import torch
from torch.nn import functional as F

from helpers.core.model import GPT, GPTConfig

MAKE_A_FOLDER = (
    'python -c "from transformers import GPT2LMHeadModel; '
    "GPT2LMHeadModel.from_pretrained('gpt2').save_pretrained('gpt2-weights')\""
)
HUB_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
# OpenAI's Conv1D weights, stored (in, out): transposed into nn.Linear's (out, in).
CONV1D_WEIGHTS = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)
_MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")
_SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "vocab_size")


class WeightsNotFoundError(OSError):
    """The weights cannot be reached (no such folder, offline without a cached copy, no network,
    or a folder without weights); the message says what to do."""


def _offline() -> bool:
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def _what_to_do(source: str) -> str:
    return (
        f"Online, load_gpt2({source!r}) downloads the weights from the Hugging Face hub "
        "(https://huggingface.co/openai-community/gpt2; needs pip install transformers). "
        "Offline, pass a folder that holds them: make one on a machine with internet with\n"
        f"    {MAKE_A_FOLDER}\n"
        "copy the folder here and call load_gpt2('gpt2-weights')."
    )


def _looks_like_a_path(source: str | Path) -> bool:
    if isinstance(source, Path):
        return True
    # a hub name is "name" or "owner/name"; anything else is meant as a folder
    return source.startswith((".", "/", "~")) or source.count("/") > 1 or "\\" in source


def resolve(source: str | Path) -> Path:
    """The folder holding ``source``'s checkpoint: ``source`` itself when it is a folder, else the
    hub name downloaded (or, with ``HF_HUB_OFFLINE=1``, found in the cache).

    Raises:
        WeightsNotFoundError: no such folder, a file instead of a folder, huggingface_hub missing,
            offline without a cached copy, or the hub unreachable; the message says what to do.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise WeightsNotFoundError(
            f"{path} is a file: pass the folder that holds config.json and the weights"
        )
    if _looks_like_a_path(source):
        raise WeightsNotFoundError(f"No folder {path}. " + _what_to_do("gpt2"))
    try:
        import huggingface_hub
    except ImportError as e:
        raise WeightsNotFoundError(
            f"Downloading {source!r} from the Hugging Face hub needs huggingface_hub: "
            "pip install transformers (it brings huggingface_hub and safetensors), "
            "or pass a folder that holds the weights."
        ) from e
    offline = _offline()
    try:
        folder = huggingface_hub.snapshot_download(
            str(source),
            allow_patterns=[*HUB_FILES, "model-*.safetensors"],
            local_files_only=offline,
        )
    except Exception as e:  # offline without a cache, no network, an unknown name
        why = (
            "HF_HUB_OFFLINE is set and there is no cached copy"
            if offline
            else f"the hub could not be reached ({type(e).__name__}: {e})"
        )
        message = f"Cannot load {source!r}: {why}. " + _what_to_do(str(source))
        raise WeightsNotFoundError(message) from e
    return Path(folder)


def read_checkpoint(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a GPT-2 checkpoint folder, read without transformers:
    ``config.json`` as a dict, the tensors by their file's names (HF layout: Conv1D weights
    (in, out)).

    Tries ``model.safetensors``, ``model.safetensors.index.json`` (shards), ``pytorch_model.bin``.

    Raises:
        WeightsNotFoundError: no config.json or no weight file; a safetensors file without the
            safetensors package (pip install safetensors).
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise WeightsNotFoundError(
            f"{folder} has no config.json: it is not a saved GPT-2. " + _what_to_do("gpt2")
        )
    config = json.loads((folder / "config.json").read_text())
    shards: list[Path] = []
    if (folder / "model.safetensors").is_file():
        shards = [folder / "model.safetensors"]
    elif (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        shards = [folder / name for name in sorted(set(index["weight_map"].values()))]
    if shards:
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise WeightsNotFoundError(
                f"{shards[0]} needs the safetensors package: pip install safetensors"
            ) from e
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(shard)))
        return config, state
    if (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return config, state
    raise WeightsNotFoundError(
        f"{folder} has config.json but no model.safetensors or pytorch_model.bin. "
        + _what_to_do("gpt2")
    )


def config_from_hf(hf: dict, vocab_multiple: int = 64, block_size: int | None = None) -> GPTConfig:
    """The course's :class:`GPTConfig` for a transformers ``GPT2Config`` (as a dict):
    ``n_positions`` -> ``block_size`` (a smaller ``block_size`` keeps the first rows of ``wpe``),
    ``n_layer``, ``n_head``, ``n_embd``, ``vocab_size`` as they are.

    Raises:
        ValueError: not a GPT-2 (``model_type``), or a variant the course's model does not compute
            (another activation or LayerNorm epsilon, an MLP width other than 4C, untied LM head,
            attention not scaled by 1/sqrt(hs) or scaled by layer index), or block_size >
            n_positions.
    """
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"not a GPT-2 checkpoint: model_type={hf.get('model_type')!r}")
    n_embd, n_positions = hf.get("n_embd", 768), hf.get("n_positions", 1024)
    differs = {
        "activation_function": (hf.get("activation_function", "gelu_new"), "gelu_new"),
        "layer_norm_epsilon": (hf.get("layer_norm_epsilon", 1e-5), 1e-5),
        "n_inner": (hf.get("n_inner") or 4 * n_embd, 4 * n_embd),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", True), True),
        "scale_attn_weights": (hf.get("scale_attn_weights", True), True),
        "scale_attn_by_inverse_layer_idx": (
            hf.get("scale_attn_by_inverse_layer_idx", False),
            False,
        ),
    }
    if differs["activation_function"][0] == "gelu_pytorch_tanh":  # the same function, fused
        differs.pop("activation_function")
    wrong = {k: v for k, (v, want) in differs.items() if v != want}
    if wrong:
        raise ValueError(
            f"this GPT-2 variant differs from the course's model in {wrong}: the course computes "
            "GELU(tanh), LayerNorm eps 1e-5, a 4C MLP, a tied LM head and 1/sqrt(hs) attention"
        )
    block_size = n_positions if block_size is None else block_size
    if block_size > n_positions:
        raise ValueError(
            f"block_size={block_size} > the checkpoint's n_positions={n_positions}: GPT-2 has no "
            f"position embedding beyond {n_positions}; use block_size <= {n_positions}"
        )
    return GPTConfig(
        block_size=block_size,
        vocab_size=hf.get("vocab_size", 50257),
        vocab_multiple=vocab_multiple,
        n_layer=hf.get("n_layer", 12),
        n_head=hf.get("n_head", 12),
        n_embd=n_embd,
    )


def course_name(hf_name: str) -> str | None:
    """The course's state-dict name of a checkpoint tensor (None: a buffer, not a weight):
    ``h.0.attn.c_attn.weight`` and ``transformer.h.0.attn.c_attn.weight`` ->
    ``transformer.h.0.attn.c_attn.weight``; ``lm_head.weight`` stays."""
    if hf_name == "lm_head.weight":
        return hf_name
    name = hf_name.removeprefix("transformer.")
    return None if _MASK_BUFFER.match(name) else "transformer." + name


def real_vocab_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """Mean cross-entropy (nats, fp32) over the real vocabulary only: logits (N, V_padded),
    targets (N,) int64 < ``vocab_size``. The padded columns take no softmax mass."""
    return F.cross_entropy(logits[:, :vocab_size].float(), targets)


def load_state(model: GPT, hf_state: dict[str, torch.Tensor]) -> None:
    """Copy a GPT-2 checkpoint's tensors (HF names and layout) into ``model`` in place: names
    mapped by :func:`course_name`, Conv1D weights transposed, ``wte`` rows beyond the real
    vocabulary zeroed, ``wpe`` cut to ``block_size`` rows.

    Raises:
        ValueError: a tensor whose shape differs from the course's (both shapes and the config in
            the message), a tensor the course's model has no place for, one it needs that is
            missing, or an LM head that differs from the token embedding (untied).
    """
    cfg = model.config
    own = model.state_dict()
    loaded: set[str] = set()
    lm_head = None
    with torch.no_grad():
        for hf_name, tensor in hf_state.items():
            name = course_name(hf_name)
            if name is None:
                continue
            if name == "lm_head.weight":
                lm_head = tensor
                continue
            if name not in own:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in the course's GPT")
            if name.endswith(CONV1D_WEIGHTS):
                tensor = tensor.t()  # Conv1D (in, out) -> nn.Linear (out, in)
            target = own[name]
            if name == "transformer.wte.weight":
                want = (cfg.vocab_size, cfg.n_embd)
                target, extra = target[: cfg.vocab_size], target[cfg.vocab_size :]
                extra.zero_()  # padded ids: logit exactly 0 (masked when sampling)
            elif name == "transformer.wpe.weight" and tensor.shape[0] >= cfg.block_size:
                tensor = tensor[: cfg.block_size]
                want = tuple(target.shape)
            else:
                want = tuple(target.shape)
            if tuple(tensor.shape) != want:
                raise ValueError(
                    f"shape mismatch: checkpoint tensor {hf_name!r} is {tuple(tensor.shape)} "
                    f"(Conv1D weights already transposed to (out, in)), the course's {name} needs "
                    f"{want} for {cfg}: the checkpoint's config.json and its weights disagree, "
                    "or config= does not describe this checkpoint"
                )
            target.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(own) - loaded - {"lm_head.weight"})
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")
        wte = model.transformer.wte.weight
        if lm_head is not None and not torch.equal(lm_head.to(wte.dtype), wte[: cfg.vocab_size]):
            raise ValueError(
                "the checkpoint's lm_head.weight differs from its wte.weight: the course's GPT "
                "ties them (one matrix), so an untied LM head cannot be loaded"
            )
    assert model.lm_head.weight is model.transformer.wte.weight  # still one tied matrix


def load_gpt2(
    source: str | Path = "gpt2",
    vocab_multiple: int = 64,
    block_size: int | None = None,
    config: GPTConfig | None = None,
    **gpt_kwargs,
) -> GPT:
    """The released GPT-2 (or any GPT-2-shaped checkpoint) as the course's :class:`GPT`, fp32, on
    the CPU, in eval() mode (move it with ``.to(device)``).

    Args:
        source: a folder (config.json + model.safetensors or pytorch_model.bin) or a hub name:
            ``"gpt2"`` (124M), ``"gpt2-medium"``, ``"gpt2-large"``, ``"gpt2-xl"``.
        vocab_multiple: pad the 50257-row embedding / LM head with zero rows to a multiple of this
            (64 -> 50304, chapter 07; 1 = no padding). Padded ids are never sampled
            (:meth:`GPT.generate`) and take no part in the loss.
        block_size: the longest sequence (default: the checkpoint's n_positions, 1024).
        config: the shape you expect; refused when the checkpoint's differs (its vocab_multiple and
            block_size are then used).
        gpt_kwargs: the model's switches (``attention="sdpa"``, ...), as for :class:`GPT`.

    ``forward(idx)`` returns logits (B, T, padded_vocab_size) whose first 50257 columns equal
    transformers' ``GPT2LMHeadModel`` on the same weights (fp32 tolerance), and the same loss.

    Raises:
        WeightsNotFoundError (an OSError): the weights cannot be reached; the message says how to
            download them online, or how to make a folder for offline use.
        ValueError: a shape mismatch (with ``config`` or inside the checkpoint), a GPT-2 variant
            the course's model does not compute, or ``loss_kernel`` other than "pytorch" with a
            padded vocabulary.
    """
    folder = resolve(source)
    hf_config, hf_state = read_checkpoint(folder)
    if config is not None:
        vocab_multiple, block_size = config.vocab_multiple, config.block_size
    shape = config_from_hf(hf_config, vocab_multiple, block_size)
    if config is not None:
        wrong = {
            f: (getattr(config, f), getattr(shape, f))
            for f in _SHAPE_FIELDS
            if getattr(config, f) != getattr(shape, f)
        }
        if wrong:
            raise ValueError(
                "shape mismatch: config= and the checkpoint in "
                f"{folder} differ in {wrong} (yours, the checkpoint's): pass config=None to use "
                "the checkpoint's shape"
            )
    padded = shape.padded_vocab_size > shape.vocab_size
    if padded and gpt_kwargs.get("loss_kernel", "pytorch") != "pytorch":
        raise ValueError(
            f"loss_kernel={gpt_kwargs['loss_kernel']!r} counts the padded columns in the loss: "
            "load with vocab_multiple=1 or loss_kernel='pytorch'"
        )
    model = GPT(shape, **gpt_kwargs)
    load_state(model, hf_state)
    if padded:  # the loss over the tokenizer's vocabulary only (see the module docstring)
        model.cross_entropy = functools.partial(
            real_vocab_cross_entropy, vocab_size=shape.vocab_size
        )
    return model.eval()
