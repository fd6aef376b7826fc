"""The release: a trained model exported, judged against the served one, and published as a
numbered version in TensorFlow Serving's layout; the writer and the reader of that layout
together (docs/deploy.md, "Versions, as TF Serving counts them"; docs/architecture.md,
"Contract extensions and precisions": publishing)."""
