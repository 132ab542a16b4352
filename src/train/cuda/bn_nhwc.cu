// Placeholder: the NHWC batch norm kernels (bn_nhwc.h) are being written.
