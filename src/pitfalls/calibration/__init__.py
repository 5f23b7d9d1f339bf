"""`pitfalls calibrate`: known-answer workloads that prove each instrument of the suite reads what it says.

The rows' types are `pitfalls.known`'s, below the families that declare rows of their own."""
