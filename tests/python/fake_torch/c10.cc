// The fake libc10.so: the tracker links it, as it links PyTorch's.
