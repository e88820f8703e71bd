"""Released GPT-2 weights in the course's model: equal to transformers' GPT2LMHeadModel.

Offline and on the CPU: a small GPT2LMHeadModel with random weights (a fixed seed) is saved to a
temporary folder and loaded with helpers.core.pretrained; transformers is the reference.
"""

import json
import shutil
import sys

import pytest
import torch
from torch.nn import functional as F

from helpers.core import evaluate, pretrained
from helpers.core.model import GPT2_VOCAB_SIZE, GPTConfig

transformers = pytest.importorskip("transformers")

V = GPT2_VOCAB_SIZE
SHAPE = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=V, n_positions=128)


def _random_gpt2(seed: int = 0):
    """A small GPT2LMHeadModel with random weights, biases and LayerNorms included (transformers'
    init leaves those at 0 and 1, which would hide a bias mapped to the wrong place). A common
    offset in the embedding and ln_f's bias puts every real logit far below 0, so the padded ids'
    logit 0 beats all of them: the case the course's masking has to handle."""
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPE)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:  # biases and LayerNorm weights
                p.add_(0.1 * torch.randn_like(p))
        u = F.normalize(torch.randn(SHAPE["n_embd"]), dim=0)
        hf.transformer.wte.weight.add_(u)  # (V, C): every row moves along u (tied: the head too)
        hf.transformer.ln_f.bias.sub_(20.0 * u)  # logit_j = h . w_j moves by about -20
    return hf


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """(folder, reference model): the random GPT-2 saved with save_pretrained (safetensors)."""
    hf = _random_gpt2()
    folder = tmp_path_factory.mktemp("gpt2-random")
    hf.save_pretrained(folder)
    return folder, hf


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(1))  # (B, T)


def _reference(hf, idx):
    with torch.no_grad():
        out = hf(idx, labels=idx)  # transformers shifts the labels itself
    return out.logits, out.loss


@pytest.mark.parametrize("vocab_multiple", [1, 64])
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_logits_and_loss_equal_transformers(hf_folder, tokens, attention, vocab_multiple):
    folder, hf = hf_folder
    model = pretrained.load_gpt2(folder, vocab_multiple=vocab_multiple, attention=attention)
    ref_logits, ref_loss = _reference(hf, tokens)
    with torch.no_grad():
        logits, _ = model(tokens)  # (B, T, padded V)
        _, loss = model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    assert logits.shape == (2, 48, 50304 if vocab_multiple == 64 else V)
    torch.testing.assert_close(logits[..., :V], ref_logits, rtol=1e-5, atol=1e-5)
    assert torch.all(logits[..., V:] == 0)  # zero rows: padded logits exactly 0
    assert abs(loss.item() - ref_loss.item()) < 1e-5
    assert not model.training and model.switches["attention"] == attention


def test_padded_ids_beat_every_real_logit_but_never_count_or_get_sampled(hf_folder, tokens):
    folder, hf = hf_folder
    model = pretrained.load_gpt2(folder, vocab_multiple=64)
    ref_logits, ref_loss = _reference(hf, tokens)
    with torch.no_grad():
        logits, _ = model(tokens)
    # Unmasked, a padded id (logit 0) would win every argmax: real logits sit far below 0 here.
    assert torch.all(logits.argmax(-1) >= V)
    assert torch.equal(logits[..., :V].argmax(-1), ref_logits.argmax(-1))
    # Counting the padded columns would move the loss by nats; the loaded model's loss does not.
    flat = logits[:, :-1].reshape(-1, logits.size(-1))
    all_columns = F.cross_entropy(flat, tokens[:, 1:].reshape(-1))
    assert all_columns.item() - ref_loss.item() > 1.0
    g = torch.Generator().manual_seed(0)
    for top_k in (None, 50):
        out = model.generate(tokens[:, :8], max_new_tokens=12, top_k=top_k, generator=g)
        assert out.shape == (2, 20) and int(out.max()) < V  # never a padded id


def test_greedy_generation_matches_transformers(hf_folder, tokens):
    folder, hf = hf_folder
    model = pretrained.load_gpt2(folder, vocab_multiple=64, attention="sdpa")
    prompt = tokens[:, :8]
    ours = model.generate(prompt, max_new_tokens=12, top_k=1)
    theirs = hf.generate(
        prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, attention_mask=None
    )
    assert torch.equal(ours, theirs)


def test_weights_stay_tied_and_conv1d_weights_are_transposed(hf_folder):
    folder, hf = hf_folder
    model = pretrained.load_gpt2(folder, vocab_multiple=64)
    assert model.lm_head.weight is model.transformer.wte.weight
    ours, theirs = model.transformer.h[1], hf.transformer.h[1]
    assert ours.attn.c_attn.weight.shape == (192, 64) and theirs.attn.c_attn.weight.shape == (
        64,
        192,
    )
    assert torch.equal(ours.attn.c_attn.weight, theirs.attn.c_attn.weight.t())
    assert torch.equal(ours.mlp.c_proj.weight, theirs.mlp.c_proj.weight.t())
    assert torch.equal(ours.ln_2.bias, theirs.ln_2.bias)


def test_an_untransposed_square_c_proj_loads_silently_and_only_the_logits_catch_it(
    hf_folder, tokens, monkeypatch
):
    folder, hf = hf_folder
    others = tuple(w for w in pretrained.CONV1D_WEIGHTS if w != "attn.c_proj.weight")
    monkeypatch.setattr(pretrained, "CONV1D_WEIGHTS", others)
    model = pretrained.load_gpt2(folder, vocab_multiple=1)  # (C, C): no shape error
    with torch.no_grad():
        logits, _ = model(tokens)
    assert (logits - _reference(hf, tokens)[0]).abs().max() > 1e-3


def test_original_hub_layout_loads_without_transformers(hf_folder, tokens, tmp_path, monkeypatch):
    """The hub's original files: saved from GPT2Model (no "transformer." prefix), with the causal
    mask buffers, as pytorch_model.bin; read with torch alone."""
    folder, hf = hf_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    state = dict(hf.transformer.state_dict())
    for i in range(SHAPE["n_layer"]):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers would fail
    monkeypatch.setitem(sys.modules, "safetensors", None)
    model = pretrained.load_gpt2(tmp_path, vocab_multiple=64)
    with torch.no_grad():
        logits, _ = model(tokens)
    monkeypatch.undo()
    torch.testing.assert_close(logits[..., :V], _reference(hf, tokens)[0], rtol=1e-5, atol=1e-5)


def test_validation_loss_of_the_loaded_model_equals_transformers(hf_folder):
    folder, hf = hf_folder
    model = pretrained.load_gpt2(folder, vocab_multiple=64)
    stream = torch.randint(0, V, (2 * 3 * 32 + 1,), generator=torch.Generator().manual_seed(2))
    ev = evaluate.validation_loss(model, batch_size=2, seq_len=32, n_batches=3, tokens=stream)
    x = stream[:-1].view(3, 2, 32)
    y = stream[1:].view(3, 2, 32)
    with torch.no_grad():
        ref = [
            F.cross_entropy(hf(xb).logits.reshape(-1, V), yb.reshape(-1)) for xb, yb in zip(x, y)
        ]
    assert abs(ev.loss - torch.stack(ref).mean().item()) < 1e-5
    assert ev.batches == 3 and ev.tokens == 192


def test_offline_without_a_copy_says_how_to_make_a_folder(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(pretrained.WeightsNotFoundError) as e:
        pretrained.load_gpt2("gpt2")
    assert isinstance(e.value, OSError)
    message = str(e.value)
    assert (
        "HF_HUB_OFFLINE" in message and "downloads the weights from the Hugging Face hub" in message
    )
    assert pretrained.MAKE_A_FOLDER in message and "save_pretrained('gpt2-weights')" in message
    with pytest.raises(pretrained.WeightsNotFoundError, match="HF_HUB_OFFLINE is set"):
        pretrained.load_gpt2("openai-community/gpt2-medium")  # owner/name: a hub name
    with pytest.raises(pretrained.WeightsNotFoundError, match="(?s)No folder .*save_pretrained"):
        pretrained.load_gpt2(tmp_path / "gpt2-weights")
    with pytest.raises(pretrained.WeightsNotFoundError, match="no config.json"):
        pretrained.load_gpt2(tmp_path)


def test_unreachable_hub_and_missing_packages_say_what_to_do(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def no_network(*args, **kwargs):
        raise ConnectionError("network unreachable")

    monkeypatch.setattr(hub, "snapshot_download", no_network)
    with pytest.raises(
        pretrained.WeightsNotFoundError, match="could not be reached.*Offline, pass"
    ):
        pretrained.load_gpt2("gpt2")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(pretrained.WeightsNotFoundError, match="pip install transformers"):
        pretrained.load_gpt2("gpt2")


def test_a_mismatched_shape_is_refused_with_both_shapes(hf_folder, tmp_path):
    folder, _ = hf_folder
    wrong = GPTConfig(block_size=128, n_layer=3, n_head=2, n_embd=64, vocab_multiple=64)
    with pytest.raises(ValueError, match=r"shape mismatch: config=.*'n_layer': \(3, 2\)"):
        pretrained.load_gpt2(folder, config=wrong)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_embd": 32}))
    with pytest.raises(
        ValueError, match=r"shape mismatch: checkpoint tensor .* is \(\d+.*needs \(\d+.*n_embd=32"
    ):
        pretrained.load_gpt2(tmp_path)
    right = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=64, vocab_multiple=64)
    assert pretrained.load_gpt2(folder, config=right).transformer.wpe.weight.shape == (64, 64)
    with pytest.raises(ValueError, match="block_size=256 > the checkpoint's n_positions=128"):
        pretrained.load_gpt2(folder, block_size=256)


def test_an_untied_lm_head_or_another_variant_is_refused(hf_folder, tmp_path):
    folder, hf = hf_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="ties them"):
        pretrained.load_gpt2(tmp_path)
    with pytest.raises(ValueError, match="activation_function"):
        pretrained.config_from_hf({"model_type": "gpt2", "activation_function": "relu"})
    with pytest.raises(ValueError, match="loss_kernel='triton' counts the padded columns"):
        pretrained.load_gpt2(folder, vocab_multiple=64, loss_kernel="triton")
