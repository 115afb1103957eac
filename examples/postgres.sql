-- Fencing writes in PostgreSQL with the lease token (leaseagent).
--
-- The token check and the data write must be ONE transaction: the fence row
-- is updated only if the job's token is not lower than the highest one seen,
-- the row count of that update tells whether it was, and the row lock it
-- takes makes every other writer of the partition wait until COMMIT.
--
-- One-time set-up -----------------------------------------------------------

CREATE TABLE IF NOT EXISTS leaseagent_fence (
    partition text   PRIMARY KEY,
    token     bigint NOT NULL CHECK (token >= 0)
);

-- Raises 'token N superseded by M' (and so aborts the transaction) unless
-- t >= the highest token recorded for p; records t otherwise. Call it first
-- in the transaction that writes p's rows.
CREATE OR REPLACE FUNCTION leaseagent_fence(p text, t bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n       integer;
    highest bigint;
BEGIN
    INSERT INTO leaseagent_fence AS f (partition, token) VALUES (p, t)
    ON CONFLICT (partition) DO UPDATE SET token = EXCLUDED.token
    WHERE f.token <= EXCLUDED.token;       -- equal allowed: the same attempt may retry
    GET DIAGNOSTICS n = ROW_COUNT;          -- 0: the row exists with a higher token
    IF n = 0 THEN
        SELECT token INTO highest FROM leaseagent_fence WHERE partition = p;
        RAISE EXCEPTION 'token % superseded by %', t, highest
            USING ERRCODE = 'P0001', HINT = 'a later lease attempt has written this partition';
    END IF;
END
$$;

-- The job's commit --------------------------------------------------------
--
--   psql -v ON_ERROR_STOP=1 -v token="$LEASE_TOKEN" -v part=2024-06-01 -f commit.sql
--
-- psql exits 3 when the fence raises; the transaction is rolled back, so no
-- row of this attempt is visible. Under READ COMMITTED a writer that waited
-- for the fence row re-checks the WHERE against the committed (higher)
-- token, so a zombie that queued behind the live attempt is still refused.

BEGIN;
SELECT leaseagent_fence(:'part', :token);
DELETE FROM export_rows WHERE partition = :'part';
INSERT INTO export_rows (partition, token, n, value)
SELECT :'part', :token, g, 'row ' || g
FROM generate_series(1, 1000) AS g;
COMMIT;

-- Without the function (e.g. from an ORM), the same in two statements:
--   UPDATE/INSERT ... ON CONFLICT ... WHERE f.token <= EXCLUDED.token;
--   -- then, in the client: if the affected row count is 0, ROLLBACK.
