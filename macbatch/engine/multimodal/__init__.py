"""Images in a prompt: checked bytes, where their rows sit, the vision tower's encodings, M-RoPE
positions, DeepStack features and Gemma 4's bidirectional image blocks (docs/vision.md)."""
