"""The data formats: what a file holds, read as float32 rows (docs/architecture.md,
"Data formats"). No TensorFlow here."""
