"""Sealing locks chain heads in one order (the chain name's), not the order a transaction wrote
its events in. Two transactions that each wrote events of tenants A and B, in opposite orders,
otherwise each held one head at commit and waited for the other's: a deadlock, one commit lost.

A plain (immediate) trigger notes each row's chain in a transaction-local setting; the deferred
sealing trigger's first run at commit takes every noted head, sorted, before it seals a row.
The setting is transaction-local, so a rolled-back savepoint forgets its chains with its rows.
"""

import importlib

from django.db import migrations

chain = importlib.import_module("console.migrations.0006_event_hash_chain")

POSTGRES = f"""
CREATE OR REPLACE FUNCTION ledger_event_note_chain() RETURNS trigger AS $$
DECLARE
    chain_name text := {chain._CHAIN};
    noted text := coalesce(current_setting('countersign.unsealed_chains', true), '');
BEGIN
    IF position(',' || chain_name || ',' in noted) = 0 THEN
        PERFORM set_config('countersign.unsealed_chains',
                           CASE WHEN noted = '' THEN ',' ELSE noted END || chain_name || ',', true);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_event_note_chain AFTER INSERT ON ledger_event
    FOR EACH ROW EXECUTE FUNCTION ledger_event_note_chain();

CREATE OR REPLACE FUNCTION ledger_event_seal() RETURNS trigger AS $$
DECLARE
    chain_name text := {chain._CHAIN};
    noted text := coalesce(current_setting('countersign.unsealed_chains', true), '');
    each_chain text;
    head_seq bigint;
    head_hash text;
    link text;
BEGIN
    -- The first run at this commit: every head this transaction will move, in the chains' order,
    -- so that two committing writers never hold one head each while waiting for the other's.
    IF noted <> '' THEN
        PERFORM set_config('countersign.unsealed_chains', '', true);
        FOR each_chain IN
            SELECT noted_chain FROM unnest(string_to_array(trim(both ',' from noted), ',')) AS noted_chain
            ORDER BY noted_chain COLLATE "C"
        LOOP
            INSERT INTO console_eventchainhead (chain, seq, hash) VALUES (each_chain, 0, '')
                ON CONFLICT (chain) DO UPDATE SET seq = console_eventchainhead.seq;
        END LOOP;
    END IF;
    -- Creates the head or locks it (already locked above, unless the setting was lost);
    -- the lock is held to the end of the commit.
    INSERT INTO console_eventchainhead (chain, seq, hash) VALUES (chain_name, 0, '')
        ON CONFLICT (chain) DO UPDATE SET seq = console_eventchainhead.seq
        RETURNING seq, hash INTO head_seq, head_hash;
    head_seq := head_seq + 1;
    link := encode(sha256(convert_to('countersign-link-v1|' || chain_name || '|' || head_seq || '|' || NEW.id
                                     || '|' || head_hash || '|' || NEW.content_hash, 'UTF8')), 'hex');
    UPDATE ledger_event SET chain_seq = head_seq, prev_hash = head_hash, hash = link WHERE id = NEW.id;
    UPDATE console_eventchainhead SET seq = head_seq, hash = link WHERE chain = chain_name;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

POSTGRES_REVERSE = """
DROP TRIGGER IF EXISTS ledger_event_note_chain ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_note_chain();
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES, params=None)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE, params=None)
        chain.remove_triggers(apps, schema_editor)
        chain.install_triggers(apps, schema_editor)  # the sealing trigger as it was


class Migration(migrations.Migration):

    dependencies = [
        ('console', '0006_event_hash_chain'),
    ]

    operations = [
        migrations.RunPython(install, restore),
    ]
