//! Model import: GGUF files (memory-mapped) and their tokenizer.
