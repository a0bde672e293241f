-- Schema of the reference runtime (version 7, which adds cm_run_restored; version 1 lacked cm_run_invocations and
-- cm_effects.resolution, versions 1-2 the 'limit_exceeded' status, versions 1-3
-- cm_runs.queue, versions 1-4 the 'cannot_migrate' and 'cancelled' statuses, versions 1-5
-- the facts beside each log record: the statements below add them to an older database). Applied by migrations.migrate() once per
-- database under an advisory lock; every statement is idempotent. Cases never truncate or
-- recreate these tables: each case uses a fresh run id, so cases share one database.

CREATE TABLE IF NOT EXISTS cm_schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- One row per run: status, the lease (owner + epoch = fencing token) and the trace context.
CREATE TABLE IF NOT EXISTS cm_runs (
    run_id            text PRIMARY KEY,
    workload          text NOT NULL,
    input             jsonb NOT NULL,
    status            text NOT NULL CHECK (status IN
                        ('pending', 'running', 'paused', 'interrupted', 'completed',
                         'failed', 'needs_human', 'limit_exceeded', 'cannot_migrate', 'cancelled')),
    lease_owner       text,
    lease_epoch       bigint NOT NULL DEFAULT 0,
    lease_expires_at  timestamptz,
    traceparent       text,
    detail            text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- The append-only run log: one protobuf NodeRecord per completed node.
CREATE TABLE IF NOT EXISTS cm_run_log (
    run_id       text   NOT NULL,
    seq          bigint NOT NULL,
    node_id      text   NOT NULL,
    record       bytea  NOT NULL,
    lease_epoch  bigint NOT NULL,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, node_id)
);

-- The effects ledger: one row per idempotency key (sha256(run_id:tool_call_id)).
CREATE TABLE IF NOT EXISTS cm_effects (
    run_id       text   NOT NULL,
    idem_key     text   NOT NULL,
    node_id      text   NOT NULL,
    tool         text   NOT NULL,
    status       text   NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'unknown')),
    request      jsonb  NOT NULL,
    result       jsonb,
    lease_epoch  bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, idem_key)
);

-- One row per invocation of a run (first start and each resume): its W3C traceparent and
-- the traceparent it links to (the invocation it continues). See tracing.py.
CREATE TABLE IF NOT EXISTS cm_run_invocations (
    run_id       text   NOT NULL,
    lease_epoch  bigint NOT NULL,
    worker       text   NOT NULL,
    traceparent  text,
    link         text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, lease_epoch)
);

-- An operator's decision on an effect the runtime could not resolve (handoff.py):
-- {"applied": true, "status": ..., "result": ...} or {"applied": false}.
ALTER TABLE cm_effects ADD COLUMN IF NOT EXISTS resolution jsonb;

-- Version 3: 'limit_exceeded' (budgets.py); version 5: 'cannot_migrate' (a record this
-- build cannot read, executor.py) and 'cancelled' (an operator's cancel, cancellation.py).
-- The inline CHECK above is named cm_runs_status_check; dropping and re-adding it is
-- idempotent and upgrades v1-v4 tables.
ALTER TABLE cm_runs DROP CONSTRAINT IF EXISTS cm_runs_status_check;
ALTER TABLE cm_runs ADD CONSTRAINT cm_runs_status_check CHECK (status IN
    ('pending', 'running', 'paused', 'interrupted', 'completed', 'failed', 'needs_human', 'limit_exceeded',
     'cannot_migrate', 'cancelled'));

-- Version 3: snapshots of the delta-and-snapshot store strategy (snapshots.py): a full
-- copy of the log up to upto_seq every k records; the log rows after it are the deltas.
CREATE TABLE IF NOT EXISTS cm_run_snapshots (
    run_id       text   NOT NULL,
    upto_seq     bigint NOT NULL,
    snapshot     bytea  NOT NULL,
    lease_epoch  bigint NOT NULL,
    PRIMARY KEY (run_id, upto_seq)
);

-- Retention scans finished runs by age (retention.py).
CREATE INDEX IF NOT EXISTS cm_runs_status_updated ON cm_runs (status, updated_at);

-- Version 4: the queue a run is filed under, for the recovery that looks for abandoned
-- runs (sweep.py); NULL: filed under none (a caller resumes it by id).
ALTER TABLE cm_runs ADD COLUMN IF NOT EXISTS queue text;
CREATE INDEX IF NOT EXISTS cm_runs_queue ON cm_runs (queue, status) WHERE queue IS NOT NULL;

-- Version 6: what the graph's rebuild needs of each record, written beside it by the
-- statement that appends it (logstore.record_facts): its kind, tokens, wall time and the
-- node ids it spawned, so a rehydrate reads the run's totals and frontier from these
-- instead of walking every record. NULL in rows written before version 6: a run with
-- such a row rehydrates by decoding every record, as before.
ALTER TABLE cm_run_log ADD COLUMN IF NOT EXISTS kind text;
ALTER TABLE cm_run_log ADD COLUMN IF NOT EXISTS tokens bigint;
ALTER TABLE cm_run_log ADD COLUMN IF NOT EXISTS wall_ms bigint;
ALTER TABLE cm_run_log ADD COLUMN IF NOT EXISTS spawned text[];

-- The log rows an operator's restore took out of a run (restore.py), kept for the record:
-- restore_epoch is the lease epoch the restore set.
CREATE TABLE IF NOT EXISTS cm_run_restored (
    run_id        text   NOT NULL,
    restore_epoch bigint NOT NULL,
    seq           bigint NOT NULL,
    node_id       text   NOT NULL,
    record        bytea  NOT NULL,
    lease_epoch   bigint NOT NULL,
    PRIMARY KEY (run_id, restore_epoch, seq)
);

INSERT INTO cm_schema_version (version) VALUES (7) ON CONFLICT DO NOTHING;
