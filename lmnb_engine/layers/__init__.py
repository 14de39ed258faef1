"""Model building blocks shared by the model families: RMSNorm, rotary embedding, gated MLP.

Each elementwise block is a ``KernelOp``: plain torch by default, fused Triton kernels
(``triton_ops``) once ``use_triton_kernels`` switches a model to them."""
