"""What the models' memory-saving inference paths share: when they may run, and how big a chunk is. Without
gradients a block runs its MLP over chunks of tokens whose hidden activations take about :data:`MLP_CHUNK_BYTES`
and adds into the residual stream in place; the arithmetic is the plain path's, token by token.
"""

import torch
from torch import nn

__all__ = ["MLP_CHUNK_BYTES", "eager_inference", "hookless", "tokens_per_chunk"]

# 4 MiB of hidden activations per chunk: 1365 tokens at WeightFormer-T's hidden width (768), 682 at
# WF-DiT-S's (1536). Large enough that a chunk's GEMMs run at full speed, small enough to stay in cache.
MLP_CHUNK_BYTES = 4 * 2**20


def tokens_per_chunk(sample_tokens: int, hidden_width: int, element_size: int, rows: int) -> int:
    """How many of ``rows`` tokens one chunk of a ``hidden_width`` MLP takes: all of them when one sample's hidden
    activations fit in :data:`MLP_CHUNK_BYTES` (chunking is for large images)."""
    step = max(1, MLP_CHUNK_BYTES // (hidden_width * element_size))
    return rows if sample_tokens <= step else step


def eager_inference() -> bool:
    """Whether the in-place, chunked inference path may run: no gradient recorded and nothing tracing the model."""
    if torch.is_grad_enabled() or torch.jit.is_scripting() or torch.jit.is_tracing():
        return False
    return not (torch.compiler.is_compiling() or torch.fx._symbolic_trace.is_fx_symbolic_tracing())


def hookless(*modules: nn.Module) -> bool:
    """Whether none of ``modules`` has a hook of its own and no hook is registered for every module:
    a path that does not call the modules would skip them."""
    for m in modules:
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return False
    hooks = nn.modules.module  # hooks registered for every module
    return not (hooks._global_forward_hooks or hooks._global_forward_pre_hooks
                or hooks._global_backward_hooks or hooks._global_backward_pre_hooks)
