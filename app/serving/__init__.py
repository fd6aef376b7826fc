"""A trained model where it is used: the export's layout, published versions, prediction."""
