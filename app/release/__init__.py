"""The release: a trained model exported, judged against the served one, and published as a
numbered version in TensorFlow Serving's layout; the writer and the reader of that layout
together (docs/architecture.md, "The release")."""
