"""vecgpt: GPT-2 where every matrix multiply is an exact vector search in a vector store."""

__version__ = "0.1.0"
