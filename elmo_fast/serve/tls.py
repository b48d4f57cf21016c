"""The server's TLS settings, its own rather than whatever the installed uvicorn defaults to: TLS 1.2 at
least; TLS 1.2 only with ephemeral elliptic-curve key exchange and AEAD ciphers (AES-GCM,
ChaCha20-Poly1305: forward secrecy, no CBC); TLS 1.3 with the suites OpenSSL offers (all AEAD); no
compression, no renegotiation, the server's order of preference. An encrypted key is opened with its
password."""

from __future__ import annotations

import ssl

from ..errors import ElmoFastError

#: OpenSSL's names of the TLS 1.2 suites allowed: ECDHE key exchange, AEAD encryption
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(certfile: str, keyfile: str | None = None, password: str | None = None) -> ssl.SSLContext:
    """The context a server listens with; a one-line :class:`ElmoFastError` naming the flag when the
    files are not a certificate and its key (or the password does not open the key)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    try:
        # a password of None with an encrypted key would prompt on the terminal: a callable never does
        context.load_cert_chain(certfile, keyfile, password=lambda: (password or "").encode())
    except ssl.SSLError as e:
        hint = (
            " (or the key is encrypted and --ssl-keyfile-password does not open it)"
            if "PEM" in str(e) or "BAD_DECRYPT" in str(e) or "bad decrypt" in str(e)
            else ""
        )
        raise ElmoFastError(
            f"--ssl-certfile {certfile}: not a certificate and key that go together ({e.reason or e}){hint}"
        ) from None
    except OSError as e:
        raise ElmoFastError(f"--ssl-certfile {certfile}: cannot read it ({e.strerror})") from None
    return context
