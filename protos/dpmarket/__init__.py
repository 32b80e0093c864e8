"""Versioned protobuf API of dpmarket."""
