"""A depthwise convolution's weight and bias gradients as loops (the C++ target).

Why: oneDNN's backward-weights for a depthwise convolution (one filter per channel) with a
large filter (ConvNeXt's 7x7, EfficientNet's 5x5) runs at about 2 GFLOP/s on one thread: ConvNeXt-T
b2 128x128, 96 channels on 32x32: 9.9 ms for the weight gradient against 1.1 ms for the
input gradient, two thirds of its convolution time in a training step, in eager and in
torch.compile alike (both call ATen). Each weight-gradient element is a sum over the batch
and the output pixels of the output gradient times the input pixel under that filter tap:
a plain reduction, here over a zero-padded copy of the input (no test per tap). The input gradient
stays ATen's call (its output_mask asks for that one alone).

Only for filters of LOOP_MIN_TAPS taps or more. Measured (one thread, forward and backward
of one convolution, b2): 7x7 at 96 and 768 channels on 32x32 and 4x4 4.0x and 2.5x faster
than eager, 5x5 at 240 channels on 16x16 2.4x; 3x3 at 32-960 channels 0.81-0.96x: ATen's
3x3 kernel is fast, and these loops do not beat it.
