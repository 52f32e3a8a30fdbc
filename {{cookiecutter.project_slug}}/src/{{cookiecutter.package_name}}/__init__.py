"""Fine-tune a Hugging Face sequence classifier with PyTorch DistributedDataParallel."""
