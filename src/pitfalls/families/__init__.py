"""The built-in pitfall families, one module each; every module exports one `Family` entry."""
