"""The curator's side of the summarization protocol (Algorithm 3 and the methods built on it)."""
