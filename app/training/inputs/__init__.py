"""The inputs before TensorFlow, from the admitted data: the validation split and the
baselines a run is judged against (no TensorFlow here)."""
