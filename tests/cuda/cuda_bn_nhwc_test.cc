// Placeholder: the GPU tests of the NHWC batch norm kernels are being written.
