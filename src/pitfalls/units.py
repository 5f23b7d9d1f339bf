"""The byte unit every figure of memory is read in."""

MIB = 2**20
