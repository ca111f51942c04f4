"""Model names, weights, configs, preprocessing and tokenization. No Jina imports here."""
