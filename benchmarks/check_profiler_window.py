"""H200 check of the profiler window fix (profile_steps synchronizes before the recorded steps):
per step, cuDNN attention backward must show n_layer calls, LayerNorm backward 2*n_layer+1,
and "outside the phases" about 0 ms. Run: PYTHONPATH=$PWD python benchmarks/check_profiler_window.py
"""

# Chapter 10's profile, as its cell 5 takes it: per-step calls of the backward kernels that must
# match the model (12 attention backwards, 25 LayerNorm backwards) and the 'outside the phases' ms.
from helpers.chapters import ch10_profiling as profiling
from helpers.core import data, train
from helpers.measure import hardware, profiler

device = hardware.default_device()
model_config, B, T = train.default_shapes(device)
run = profiling.chapter_rung(B, T, device, eager=True)
trainer = train.build(run, model_config, device)
loader = data.BatchLoader(data.load_tokens(), B, T, device)
prof = profiler.profile_steps(trainer, loader, wait=1, warmup=1, active=3)
print(f"{prof.device_name}, {prof.steps} steps, n_layer {model_config.n_layer}")
keys = (
    "bprop",
    "GammaBetaBackward",
    "layer_norm_grad_input",
    "vectorized_layer_norm",
    "bwd",
    "cunn_SoftMaxBackward",
    "aten::native_layer_norm",
    "attention_backward",
)
for k in prof.kernels:
    if any(s in k["name"] for s in keys):
        print(f"{k['calls']:>6} calls/step {k['ms']:8.3f} ms/step  {k['name'][:80]}")
print({p: round(ms, 2) for p, ms in prof.phases_ms.items()})
print("outside the phases:", round(prof.phases_ms.get(profiler.UNATTRIBUTED, 0.0), 3), "ms/step")
