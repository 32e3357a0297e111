// What a web frontend's generated client does against a live drover: a
// typescript-fetch client generated from openapi/openapi.json by
// openapi-generator, compiled with tsc together with this program, run by
// node (its built-in fetch; no npm package). Run by scripts/ts_client_e2e.sh,
// which generates the client into ./client beside this file and starts a
// server on the simulated runtime with a fresh store.
//
//     node e2e.js BASE_URL ADMIN_TOKEN
//
// Every request goes through the generated client. The checks are the
// places generated clients tripped over: a patch's `null` resets dropped by
// the client, an operation answering two shapes, a diff's values typed
// `any`.

import {
    ApplyApi,
    ClustersApi,
    Configuration,
    CreatePool,
    JsonValue,
    PoolPatch,
    PoolsApi,
    ResponseError,
    UpgradePlan,
    UpgradeView,
    UpgradesApi,
} from './client';

// Node's globals this program uses (the @types/node package is not here).
declare const process: { argv: string[]; exitCode?: number };

function fail(message: string): never {
    throw new Error(`ts_client_e2e: FAIL: ${message}`);
}

function check(condition: boolean, message: string): void {
    if (!condition) {
        fail(message);
    }
}

function step(message: string): void {
    console.log(`ts_client_e2e: ${message}`);
}

/** The problem+json a refused call answered: its status and the fields it names. */
async function refusal(call: Promise<unknown>): Promise<{ status: number; type: string; fields: string[]; detail: string }> {
    try {
        await call;
    } catch (e) {
        if (!(e instanceof ResponseError)) {
            throw e;
        }
        const type = e.response.headers.get('content-type') ?? '';
        check(type.startsWith('application/problem+json'), `a refusal is a problem, not ${type}`);
        const body = await e.response.json();
        const fields = Array.isArray(body.errors) ? body.errors.map((f: { field: string }) => f.field) : [];
        return { status: e.response.status, type: String(body.type), fields, detail: String(body.detail ?? '') };
    }
    return fail('the call was expected to be refused, and succeeded');
}

/**
 * Compiled, never run: the generated types say what the document says.
 * tsc fails the run if a line marked `@ts-expect-error` compiles.
 */
export function typesOnly(upgrades: UpgradesApi, patch: PoolPatch): void {
    // A start answers a job, a plan answers a plan: one type each.
    const started: Promise<UpgradeView> = upgrades.createUpgrade({ name: 'c', createUpgrade: { version: 'v1.30.0' } });
    const planned: Promise<UpgradePlan> = upgrades.planUpgrade({ name: 'c', createUpgrade: { version: 'v1.30.0' } });
    // Lists of names are arrays (not sets) and reset with null...
    patch.engines = null;
    patch.failureDomains = null;
    // ...a list of objects with [], since the client would drop its null.
    patch.extraMounts = [];
    // @ts-expect-error: a null list of objects would not reach the server
    patch.extraMounts = null;
    void started;
    void planned;
}

async function main(): Promise<void> {
    const [base, token] = process.argv.slice(2);
    check(Boolean(base && token), 'usage: node e2e.js BASE_URL ADMIN_TOKEN');
    const config = new Configuration({ basePath: base, accessToken: async () => token });
    const pools = new PoolsApi(config);
    const upgrades = new UpgradesApi(config);
    const clusters = new ClustersApi(config);
    const apply = new ApplyApi(config);
    const name = 'ts-e2e';

    step('create a pool with failure domains, engines, extra mounts and labels');
    const created: CreatePool = {
        name,
        replicas: 2,
        version: 'v1.29.2',
        failureDomains: ['zone-a', 'zone-b'],
        engines: ['local'],
        extraMounts: [{ hostPath: '/srv/ts-e2e', containerPath: '/data' }],
        labels: { team: 'web' },
    };
    const view = await pools.createPool({ createPool: created });
    check(view.generation === 1, `created: ${JSON.stringify(view)}`);
    check(Array.isArray(view.failureDomains), 'failure domains arrive as an array, in order');
    check(view.failureDomains.join() === 'zone-a,zone-b', `failure domains: ${view.failureDomains}`);
    check(view.engines.join() === 'local' && view.extraMounts.length === 1, `created: ${JSON.stringify(view)}`);

    step('patch: reset failure_domains and engines with null, extra_mounts with [], labels with null');
    const reset: PoolPatch = { failureDomains: null, engines: null, extraMounts: [], labels: null };
    const patched = await pools.patchPool({ name, poolPatch: reset });
    check(patched.generation === 2, `the reset is a change: generation ${patched.generation}`);
    const seen = await pools.getPool({ name });
    check(seen.failureDomains.length === 0, `the server reset failure_domains: ${JSON.stringify(seen.failureDomains)}`);
    check(seen.engines.length === 0, `the server reset engines: ${JSON.stringify(seen.engines)}`);
    check(seen.extraMounts.length === 0, `the server reset extra_mounts: ${JSON.stringify(seen.extraMounts)}`);
    check(Object.keys(seen.labels).length === 0, `the server reset labels: ${JSON.stringify(seen.labels)}`);
    const duplicate = await refusal(pools.patchPool({ name, poolPatch: { failureDomains: ['z', 'z'] } }));
    check(duplicate.status === 422 && duplicate.fields.includes('failure_domains[1]'), `a repeat: ${JSON.stringify(duplicate)}`);

    step('upgrades: the plan route, against a registered cluster whose API does not answer');
    // A closed port on loopback: the plan's first read fails at once.
    await clusters.createCluster({ createCluster: { name: 'ts-gone', server: 'https://127.0.0.1:1', token: 'ts-e2e' } });
    const unreachable = await refusal(upgrades.planUpgrade({ name: 'ts-gone', createUpgrade: { version: 'v1.30.0' } }));
    check(unreachable.status === 503, `an unreachable cluster's plan is a 503 problem: ${JSON.stringify(unreachable)}`);
    const missing = await refusal(upgrades.planUpgrade({ name: 'ts-none', createUpgrade: { version: 'v1.30.0' } }));
    check(missing.status === 404, `no such cluster: ${JSON.stringify(missing)}`);
    // The old body, `dry_run: true` on the start, starts nothing.
    const old = await refusal(upgrades.createUpgrade({ name: 'ts-gone', createUpgrade: { version: 'v1.30.0', dryRun: true } }));
    check(old.status === 422 && old.fields.includes('dry_run'), `dry_run on the start: ${JSON.stringify(old)}`);
    check(old.detail.includes('/v1/clusters/ts-gone/upgrades/plan'), `the refusal names the plan route: ${old.detail}`);
    check((await upgrades.listUpgrades({})).items.length === 0, 'no job was started');

    step("a diff's before and after, typed: a dry run of changes to the pool");
    const result = await apply.apply({
        applyRequest: {
            applySet: 'ts-e2e',
            dryRun: true,
            adopt: true,
            documents: [{
                kind: 'Pool',
                name,
                spec: { replicas: 3, version: 'v1.29.2', failureDomains: ['zone-c'], labels: { team: 'api' } },
            }],
        },
    });
    const changes = result.objects[0]?.changes ?? fail(`no object in ${JSON.stringify(result)}`);
    const change = (path: string): { before: JsonValue | null; after: JsonValue | null } =>
        changes.find((c) => c.path === path) ?? fail(`no change of ${path} in ${JSON.stringify(changes)}`);
    const replicas = change('replicas');
    check(replicas.before === 2 && replicas.after === 3, `replicas 2 -> 3: ${JSON.stringify(replicas)}`);
    const domains = change('failure_domains').after;
    check(Array.isArray(domains) && domains.join() === 'zone-c', `a list after: ${JSON.stringify(domains)}`);
    const team = change('labels.team');
    check(team.before === null && team.after === 'api', `a label added: ${JSON.stringify(team)}`);
    check((await pools.getPool({ name })).replicas === 2, 'the dry run changed nothing');

    step('delete the pool');
    await pools.deletePool({ name });
    step('ok');
}

main().catch((e) => {
    console.error(e instanceof Error ? e.message : e);
    process.exitCode = 1;
});
