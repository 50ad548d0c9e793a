"""Small statistics helpers."""


def mean(values):
    """The arithmetic mean; raises ValueError for an empty sequence."""
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def median(values):
    """The median: the middle value, or the mean of the two middle values for an even count.

    Raises ValueError for an empty sequence.
    """
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle]


def mode(values):
    """The most frequent value; on a tie, the smallest of the most frequent values.

    Raises ValueError for an empty sequence.
    """
    if not values:
        raise ValueError("mode of no values")
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=counts.get)
