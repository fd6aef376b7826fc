"""Data: text parsing, the binary cache, tf.data pipelines and synthetic demo data."""
