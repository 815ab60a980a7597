"""The couplet model: tokenizer, transformer, checkpoint, rule-guided decoding, 横批."""
