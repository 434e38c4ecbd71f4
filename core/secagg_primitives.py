"""The cryptographic building blocks of SecAgg+ (core/secagg.py), on ``cryptography`` alone so
that core stays free of Flower: EC key pairs, ECDH + HKDF key agreement, authenticated
encryption (Fernet), Shamir secret sharing over a prime field, and the framing of the pair of
shares one client sends another.

Only headway's own client and server speak this protocol (client/secure_aggregation.py and
strategies/secure_aggregation.py both call core/secagg.py), so these are not byte-compatible
with Flower's SecAgg+ where nothing needs them to be. What is the same as Flower's primitives:
the curve and PEM key formats, and the key agreement (ECDH, then HKDF-SHA256 to 32 bytes, no
salt or info). What differs: Shamir shares are over the prime field of 2^521 − 1, not
PyCryptodome's GF(2^128), so a share's layout is this module's own (:func:`create_shares`).

Key generation, ECDH, HKDF, Fernet and the ChaCha20 of the masks are ``cryptography``'s; the
only arithmetic written here is Shamir's, which is polynomial evaluation and Lagrange
interpolation in a field, with coefficients from OS entropy.
"""

from __future__ import annotations

import base64
import secrets
import struct

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

CURVE = "secp384r1"  # the curve of every key pair; the server refuses public keys on any other
KEY_BYTES = 32  # what key agreement yields: a Fernet key, or a ChaCha20 key for a pairwise mask

# Shamir: a secret is cut into chunks of CHUNK_BYTES, each an element of the field of PRIME
# (a Mersenne prime, 2^521 − 1, so every 512-bit chunk is below it), shared with its own polynomial
PRIME = 2**521 - 1
CHUNK_BYTES = 64
VALUE_BYTES = 66  # a field element, big-endian: 521 bits round up to 66 bytes
SHARE_HEADER = struct.Struct("<II")  # the share's x (1, 2, …) and the secret's length in bytes
PAIR_HEADER = struct.Struct("<QQI")  # sender id, receiver id, length of the first share


# ----- key pairs and key agreement ---------------------------------------------------------


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh key pair on :data:`CURVE`: (private key as unencrypted PKCS#8 PEM, public key as
    SubjectPublicKeyInfo PEM), the formats Flower's SecAgg+ uses too."""
    private = ec.generate_private_key(ec.SECP384R1())
    return private_to_bytes(private), public_to_bytes(private.public_key())


def private_to_bytes(private: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM: it is only ever kept in the node's state or Shamir-shared."""
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def public_to_bytes(public: ec.EllipticCurvePublicKey) -> bytes:
    """A public key as SubjectPublicKeyInfo PEM, as it travels in a setup reply."""
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(data: bytes) -> ec.EllipticCurvePrivateKey:
    """The EC private key in ``data`` (PEM); ValueError when it is not one (the server runs this
    on secrets rebuilt from clients' shares)."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (TypeError, UnsupportedAlgorithm) as e:  # an encrypted PEM, an unknown key type: still "not a key we can use"
        raise ValueError(f"not a usable private key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"not an EC private key but a {type(key).__name__}")
    return key


def load_public_key(data: bytes) -> ec.EllipticCurvePublicKey:
    """The EC public key in ``data`` (PEM); ValueError when it is not one (a public key of
    another kind, or no key at all): the server runs this on what clients send."""
    try:
        key = serialization.load_pem_public_key(data)
    except UnsupportedAlgorithm as e:
        raise ValueError(f"not a usable public key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError(f"not an EC public key but a {type(key).__name__}")
    return key


def public_key_of(private: bytes) -> bytes:
    """The public key (PEM) of a private key (PEM): how the server checks a rebuilt private key."""
    return public_to_bytes(load_private_key(private).public_key())


def agree(private: bytes, public: bytes) -> bytes:
    """The 32-byte key the owners of ``private`` and of the private key behind ``public`` both
    compute: ECDH on the curve, then HKDF-SHA256 (the raw ECDH output is not uniform)."""
    shared = load_private_key(private).exchange(ec.ECDH(), load_public_key(public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=None).derive(shared)


# ----- authenticated encryption ------------------------------------------------------------


def encrypt(key: bytes, plaintext: bytes) -> bytes:
    """``plaintext`` under a 32-byte key from :func:`agree`, with Fernet (AES-128-CBC and
    HMAC-SHA256): a relaying server can neither read it nor change it unnoticed."""
    return Fernet(base64.urlsafe_b64encode(key)).encrypt(plaintext)


def decrypt(key: bytes, token: bytes) -> bytes:
    """The plaintext of a :func:`encrypt` token; ValueError when the token was made with
    another key or altered on the way."""
    try:
        return Fernet(base64.urlsafe_b64encode(key)).decrypt(token)
    except InvalidToken:
        raise ValueError("the ciphertext does not authenticate under this key (another key, or altered)") from None


# ----- Shamir secret sharing ---------------------------------------------------------------


def create_shares(secret: bytes, threshold: int, num: int) -> list[bytes]:
    """``num`` shares of ``secret``, any ``threshold`` of which rebuild it and fewer of which
    say nothing about it. Each chunk of the secret is the constant term of its own polynomial
    of degree threshold − 1 with uniform coefficients; share i holds every polynomial's value
    at x = i. Layout: x and the secret's length (two little-endian uint32), then one
    :data:`VALUE_BYTES` big-endian value per chunk."""
    if not secret:
        raise ValueError("nothing to share: the secret is empty")
    if not 1 <= threshold <= num < 2**32:
        raise ValueError(f"a threshold of {threshold} for {num} shares: needs 1 <= threshold <= shares")
    polynomials = [[_chunk_value(chunk)] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)] for chunk in _chunks(secret)]
    return [
        SHARE_HEADER.pack(x, len(secret)) + b"".join(_evaluate(p, x).to_bytes(VALUE_BYTES, "big") for p in polynomials)
        for x in range(1, num + 1)
    ]


def combine_shares(shares: list[bytes]) -> bytes:
    """The secret whose shares these are, by Lagrange interpolation at x = 0 of every chunk's
    polynomial. Fewer than the threshold give a wrong value (or this error); shares of different
    secrets, repeated x or malformed bytes raise ValueError, as does a chunk that does not fit
    its length (a sign of a bad share, though a bad share need not show)."""
    points = [_parse_share(share) for share in shares]
    if not points:
        raise ValueError("no shares to combine")
    length = points[0][1]
    if any(p[1] != length for p in points):
        raise ValueError("the shares are of secrets of different lengths")
    xs = [p[0] for p in points]
    if len(set(xs)) != len(xs):
        raise ValueError("two shares have the same x")
    weights = _lagrange_at_zero(xs)
    sizes = [len(c) for c in _chunks(bytes(length))]
    out = bytearray()
    for i, size in enumerate(sizes):
        value = sum(w * p[2][i] for w, p in zip(weights, points, strict=True)) % PRIME
        if value >= 1 << (8 * size):
            raise ValueError("the shares do not agree on a secret (the rebuilt chunk does not fit its length)")
        out += value.to_bytes(size, "big")
    return bytes(out)


def _chunks(secret: bytes) -> list[bytes]:
    return [secret[i : i + CHUNK_BYTES] for i in range(0, len(secret), CHUNK_BYTES)]


def _chunk_value(chunk: bytes) -> int:
    return int.from_bytes(chunk, "big")


def _evaluate(coefficients: list[int], x: int) -> int:
    """Σ_k c_k x^k mod PRIME (Horner)."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % PRIME
    return value


def _lagrange_at_zero(xs: list[int]) -> list[int]:
    """λ_i = Π_{j≠i} x_j / (x_j − x_i) mod PRIME, so that f(0) = Σ λ_i f(x_i) for any f of degree < len(xs)."""
    weights = []
    for i, xi in enumerate(xs):
        numerator, denominator = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                numerator = numerator * xj % PRIME
                denominator = denominator * (xj - xi) % PRIME
        weights.append(numerator * pow(denominator, -1, PRIME) % PRIME)
    return weights


def _parse_share(share: bytes) -> tuple[int, int, list[int]]:
    """(x, secret length, chunk values) of a share; ValueError when its bytes are not a share."""
    if len(share) < SHARE_HEADER.size:
        raise ValueError(f"a share of {len(share)} bytes is shorter than its header")
    x, length = SHARE_HEADER.unpack_from(share)
    count = -(-length // CHUNK_BYTES)
    if x == 0 or length == 0 or len(share) != SHARE_HEADER.size + count * VALUE_BYTES:
        raise ValueError("malformed share: x = 0, an empty secret, or a size that does not match its length")
    body = share[SHARE_HEADER.size :]
    values = [int.from_bytes(body[k * VALUE_BYTES : (k + 1) * VALUE_BYTES], "big") for k in range(count)]
    if any(v >= PRIME for v in values):
        raise ValueError("malformed share: a value outside the field")
    return x, length, values


# ----- what one client sends another ---------------------------------------------------------


def pack_pair(sender: int, receiver: int, seed_share: bytes, key_share: bytes) -> bytes:
    """The plaintext of one encrypted message: who it is from and for (uint64 node ids, so a
    relaying server cannot pass it off as another's), then the two shares."""
    return PAIR_HEADER.pack(sender, receiver, len(seed_share)) + seed_share + key_share


def unpack_pair(plaintext: bytes) -> tuple[int, int, bytes, bytes]:
    """(sender, receiver, seed share, key share) of a :func:`pack_pair` plaintext; ValueError when it is too short for its header."""
    if len(plaintext) < PAIR_HEADER.size:
        raise ValueError(f"a share message of {len(plaintext)} bytes is shorter than its header")
    sender, receiver, first = PAIR_HEADER.unpack_from(plaintext)
    body = plaintext[PAIR_HEADER.size :]
    if first > len(body):
        raise ValueError(f"a share message says its first share has {first} bytes, but only {len(body)} follow")
    return sender, receiver, body[:first], body[first:]
