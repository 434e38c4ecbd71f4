"""The cryptographic building blocks of SecAgg+ (core/secagg.py), without Flower so that core
stays free of it: EC key pairs, ECDH + HKDF key agreement and authenticated encryption (Fernet)
from ``cryptography``; Shamir secret sharing from PyCryptodome (``Crypto.Protocol.SecretSharing``,
GF(2^128), as Flower's shamir.py uses it); and the framing of the pair of shares one client
sends another.

Only headway's own client and server speak this protocol (client/secure_aggregation.py and
strategies/secure_aggregation.py both call core/secagg.py), so these are not byte-compatible
with Flower's SecAgg+ where nothing needs them to be. What is the same as Flower's primitives:
the curve and PEM key formats, the key agreement (ECDH, then HKDF-SHA256 to 32 bytes, no salt
or info), and the sharing (PKCS#7 padding to 16-byte chunks, each split by PyCryptodome with its
own polynomial). What differs: a share's header also carries the secret's length, so that shares
of different secrets are refused before any arithmetic (:func:`create_shares`).

No cryptographic arithmetic is written here: key generation, ECDH, HKDF, Fernet and the ChaCha20
of the masks are ``cryptography``'s, the polynomials and their interpolation PyCryptodome's; this
module only cuts, frames and checks bytes.
"""

from __future__ import annotations

import base64
import struct

from Crypto.Protocol.SecretSharing import Shamir
from Crypto.Util.Padding import pad, unpad
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

CURVE = "secp384r1"  # the curve of every key pair; the server refuses public keys on any other
KEY_BYTES = 32  # what key agreement yields: a Fernet key, or a ChaCha20 key for a pairwise mask

# Shamir: a secret is PKCS#7-padded and cut into chunks of CHUNK_BYTES, the size of an element of
# GF(2^128), the one size PyCryptodome's Shamir shares; each chunk gets its own polynomial
CHUNK_BYTES = 16
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
    say nothing about it: the secret, PKCS#7-padded to whole chunks, is split chunk by chunk by
    PyCryptodome's Shamir (each chunk the constant term of its own random polynomial of degree
    threshold − 1 over GF(2^128)). Layout: x (1, 2, …) and the secret's length (two
    little-endian uint32), then the :data:`CHUNK_BYTES` share of each chunk at x."""
    if not secret:
        raise ValueError("nothing to share: the secret is empty")
    if not 1 <= threshold <= num < 2**32:
        raise ValueError(f"a threshold of {threshold} for {num} shares: needs 1 <= threshold <= shares")
    shares = [bytearray(SHARE_HEADER.pack(x, len(secret))) for x in range(1, num + 1)]
    for chunk in _chunks(pad(secret, CHUNK_BYTES)):
        for x, value in Shamir.split(threshold, num, chunk, ssss=False):
            shares[x - 1] += value
    return [bytes(share) for share in shares]


def combine_shares(shares: list[bytes]) -> bytes:
    """The secret whose shares these are, each chunk rebuilt by PyCryptodome's Shamir (which
    interpolates through every share given, so more than the threshold is fine). Fewer than the
    threshold give a wrong value (or this error); shares of different secrets, repeated x or
    malformed bytes raise ValueError, as does a rebuilt secret whose padding or length is not
    what the header says (a sign of a bad share, though a bad share need not show)."""
    points = [_parse_share(share) for share in shares]
    if not points:
        raise ValueError("no shares to combine")
    length = points[0][1]
    if any(p[1] != length for p in points):
        raise ValueError("the shares are of secrets of different lengths")
    xs = [p[0] for p in points]
    if len(set(xs)) != len(xs):
        raise ValueError("two shares have the same x")
    columns = zip(*(p[2] for p in points), strict=True)  # chunk by chunk: every share's value of that chunk
    padded = b"".join(Shamir.combine(list(zip(xs, column, strict=True)), ssss=False) for column in columns)
    try:
        secret = unpad(padded, CHUNK_BYTES)
    except ValueError:
        raise ValueError("the shares do not agree on a secret (its padding did not come back)") from None
    if len(secret) != length:
        raise ValueError("the shares do not agree on a secret (it is not of the length their headers say)")
    return secret


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]


def _padded_size(length: int) -> int:
    """The bytes of a secret of ``length`` after PKCS#7 padding: always at least one byte more."""
    return (length // CHUNK_BYTES + 1) * CHUNK_BYTES


def _parse_share(share: bytes) -> tuple[int, int, list[bytes]]:
    """(x, secret length, chunk shares) of a share; ValueError when its bytes are not a share."""
    if len(share) < SHARE_HEADER.size:
        raise ValueError(f"a share of {len(share)} bytes is shorter than its header")
    x, length = SHARE_HEADER.unpack_from(share)
    if x == 0 or length == 0 or len(share) != SHARE_HEADER.size + _padded_size(length):
        # x = 0 would be the secret itself, a share no sharing hands out
        raise ValueError("malformed share: x = 0, an empty secret, or a size that does not match its length")
    return x, length, _chunks(share[SHARE_HEADER.size :])


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
