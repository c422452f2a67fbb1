"""Loss scaling's reference for LossScaler.WholePathThroughTheAccelerator_* (worker_precision_test).

Runs torch.cuda.amp.GradScaler's own Python code on the CPU: `python3 -O` drops its asserts that
tensors are on CUDA, and its two CUDA-only kernels are replaced by ports of their CUDA source
(aten/src/ATen/native/cuda/AmpKernels.cu, torch 1.13), since libtorch 1.13 has no CPU kernel for
either. A float16 model (float32 parameters, float16 compute, a float16 loss) trains for a few
steps with clipping, through an inf/nan skip and a growth of the scale.

Prints one line per step: "batch" with the inputs the test feeds the worker, then "expect" with
the loss, whether the optimizer stepped, the scale after the update and the parameters.
"""
import math
import sys

import torch
import torch.cuda.amp.grad_scaler as grad_scaler

if sys.flags.optimize == 0:
    sys.exit("run with python3 -O: GradScaler asserts that its tensors are on CUDA")


def non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    # The kernel checks each value before unscaling it, and multiplies in float32.
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        if float(inv_scale) != 1.0:
            g.mul_(inv_scale)


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval):
    # The kernel's float32 scale times a float64 factor; growth that overflows is not applied.
    if float(found_inf) != 0:
        scale.fill_(float(scale) * backoff_factor)
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker) + 1
        if successful == interval:
            grown = float(torch.tensor(float(scale) * growth_factor, dtype=torch.float32))
            if math.isfinite(grown):
                scale.fill_(grown)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


torch._amp_foreach_non_finite_check_and_unscale_ = non_finite_check_and_unscale_
torch._amp_update_scale_ = update_scale_
grad_scaler.amp_definitely_not_available = lambda: False  # else GradScaler disables itself

w = torch.tensor([0.5, -0.25, 0.125, 1.0], requires_grad=True)
b = torch.tensor([0.1], requires_grad=True)
optimizer = torch.optim.SGD([w, b], lr=0.1)
scaler = grad_scaler.GradScaler(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                                growth_interval=2000)

generator = torch.Generator().manual_seed(7)
for step in range(10):
    x = torch.randn(2, 4, generator=generator)
    y = torch.randn(2, 4, generator=generator)
    if step == 4:
        x.fill_(300.0)  # the float16 forward overflows: inf loss, nan gradients, skipped
    jump = 1998 if step == 6 else -1  # 2,000 clean steps later: the next two grow the scale
    print("batch", jump, *[repr(v) for v in x.flatten().tolist() + y.flatten().tolist()])
    if jump >= 0:
        scaler._growth_tracker.fill_(jump)
    h = x.half() * w.half() + b.half()
    loss = ((h - y.half()) * (h - y.half())).sum()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_([w, b], 1.0)
    before = w.detach().clone()
    scaler.step(optimizer)
    stepped = not torch.equal(before, w.detach())
    scaler.update()
    optimizer.zero_grad()
    print("expect", repr(float(loss)), int(stepped), repr(scaler.get_scale()),
          *[repr(v) for v in w.tolist() + b.tolist()])
