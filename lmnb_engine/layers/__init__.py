"""Model building blocks shared by the model families: RMSNorm, rotary embedding, gated MLP."""
