"""TensorFlow's input from the cache: the training order, the validation split, the
streamed batches and the tf.data pipeline. Only ``pipeline`` imports TensorFlow."""
