// Placeholder: Tensor's element types are being written.
