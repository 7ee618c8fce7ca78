"""Root-cause analysis: the verdict, and the multimodal model that produces it."""
