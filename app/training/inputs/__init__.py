"""The inputs before TensorFlow: the data files and their cache, the memory check, the split
and the baselines a run is judged against (no TensorFlow here)."""
