"""coretrain: a batch training job that sizes TensorFlow to its container's CPUs."""

__version__ = "0.1.0"
