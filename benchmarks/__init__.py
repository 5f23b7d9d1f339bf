"""The asv benchmark suite of pitfalls (see asv.conf.json); the logic lives in the pitfalls package."""
