"""The CRC-32C of two byte strings put end to end, from their own CRCs and the second's length.

A storage node that receives an object in parts (over several connections, each part
checksummed as it passed) gets the object's checksum from the parts' without reading the
object again: on the NVMe tier that read would go to the disk. This is zlib's
``crc32_combine`` (multiplication modulo the CRC's polynomial, by x to the power of the
second part's length in bits), with CRC-32C's polynomial: a few hundred integer operations
per combine, whatever the lengths.
"""

from __future__ import annotations

#: CRC-32C's polynomial, bit-reflected (as the CRC is computed).
_POLY = 0x82F63B78
_X0 = 1 << 31  # x**0 in the reflected representation


def _multiply(a: int, b: int) -> int:
    """a * b modulo the polynomial."""
    product = 0
    mask = _X0
    while mask:
        if a & mask:
            product ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        mask >>= 1
    return product


def _powers() -> list[int]:
    """x**(2**k) modulo the polynomial, for k = 0..63."""
    powers = []
    power = _X0 >> 1  # x**1
    for _ in range(64):
        powers.append(power)
        power = _multiply(power, power)
    return powers


_X_2K = _powers()


def _x_power(exponent: int) -> int:
    """x**exponent modulo the polynomial."""
    result, k = _X0, 0
    while exponent:
        if exponent & 1:
            result = _multiply(_X_2K[k], result)
        exponent >>= 1
        k += 1
    return result


def crc32c_combine(first: int, second: int, second_length: int) -> int:
    """The CRC-32C of ``A + B`` given ``crc(A)``, ``crc(B)`` and ``len(B)``."""
    if second_length < 0:
        raise ValueError(f"a length must not be negative, got {second_length}")
    return _multiply(_x_power(8 * second_length), first) ^ second
