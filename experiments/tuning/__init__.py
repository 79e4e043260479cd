"""The steps run once per profile before its notebooks: the stand-ins' difficulty fitted to cross-entropy, and each
loss's learning rate."""
