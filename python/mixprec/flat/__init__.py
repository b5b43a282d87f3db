"""Flat-buffer mode: a model's params and grads as views into one buffer per (device, dtype).

:func:`flat_buffers` moves every trainable parameter of a model into one contiguous
buffer per (device, dtype) (``param.data`` becomes a view of it; the
:class:`~torch.nn.Parameter` objects stay the same, so modules, optimizers and
``state_dict`` keys are untouched) and gives each parameter a gradient that is a view
of a second buffer of the same layout. :class:`mixprec.GradScaler` and the
:mod:`mixprec.optim` optimizers recognise such views and hand the kernels one tensor
per contiguous run of views instead of one per parameter, so the kernels' host work
per step no longer grows with the number of tensors. The optimizers then also keep
their float32 state (moments, momentum buffers, masters) as views of flat buffers of
the same layout, and the step counts of params stepped together as one shared tensor.

How the gradients stay views (checked on torch 2.4-2.14):

* ``zero_grad(set_to_none=False)`` zeroes each ``param.grad`` in place. Autograd's
  ``AccumulateGrad`` then adds the new gradient into the existing ``.grad`` in place
  (``grad += new`` when the backward does not create a graph), so the view stays.
* ``zero_grad(set_to_none=True)`` (torch.optim's default) and ``param.grad = x`` replace
  the view. ``AccumulateGrad`` then installs a new tensor (the incoming gradient itself
  or a copy). A post-accumulate-grad hook on every parameter
  (:meth:`torch.Tensor.register_post_accumulate_grad_hook`) copies that tensor into the
  view and sets ``param.grad`` back to the view, so after every backward the grads are
  views again. The copy is exact, so results are bitwise those of the same model
  without the mode.
* A gradient that requires grad (``backward(create_graph=True)``), has another dtype,
  shape or device, or a parameter whose ``.data`` was replaced (``model.to(...)`` after
  this call), is left alone: that parameter simply runs on the per-tensor path.

Detection (:func:`coalesce`, :func:`coalesce_bucket`) is exact and cheap: a tensor
counts as a view only if it is the very view object installed here (``id``) *and*
still has its data pointer. Views of one buffer that sit next to each other (their
order in the list does not matter for the elementwise kernels) become one 1-D slice of
the buffer; the padding between views (alignment, at most 15 bytes per view) is zero
in every buffer and stays zero under unscaling and under every optimizer update (a
zero gradient and zero state leave a zero weight unchanged). Anything else (a replaced
grad, a param without grad, a frozen param in the middle, other param groups) splits
the runs or stays per tensor: results never depend on the detection.

Not bitwise with the per-tensor path: the stochastic-rounding bits of bf16 params
without masters (they are numbered per launch chunk, so another layout draws other,
equally distributed bits) and the rounding of gradient norms (the partial sums are
combined over other chunks).
"""

from __future__ import annotations

# The hooks amp.grads.optimizer_grads and FusedOptimizer call (mixprec-internal):
from .detect import coalesce as coalesce
from .detect import coalesce_and_keep as coalesce_and_keep
from .detect import coalesce_grads as coalesce_grads
from .detect import kept_grads as kept_grads
from .layout import GRAD_VIEWS as GRAD_VIEWS
from .layout import FlatBuffers, flat_buffers
from .state import any_flat as any_flat
from .state import coalesce_bucket as coalesce_bucket
from .state import init_state as init_state
from .state import reuse_whole as reuse_whole
from .state import whole_group as whole_group

__all__ = ["FlatBuffers", "flat_buffers"]
