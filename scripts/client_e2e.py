"""End-to-end flow through a client generated from openapi/openapi.json.

Run by scripts/client_e2e.sh, which generates the client (package
`drover_client`, on PYTHONPATH) and starts a server on the simulated runtime.
Every request goes through the generated client: no hand-written HTTP. The
script also checks that the typed models it gets back hold every field the
server always sends (no `Unset`), and that errors arrive as typed problems.

    python3 scripts/client_e2e.py BASE_URL TOKEN [CA_FILE]

With CA_FILE (an https:// BASE_URL), the client trusts that CA alone.
"""

import sys
import time

import attrs

from drover_client import AuthenticatedClient
from drover_client.api.apply import apply as apply_fleet
from drover_client.api.machines import delete_machine, get_machine, list_machines, request_machine_deletion
from drover_client.api.pools import (
    create_pool,
    delete_pool,
    get_pool,
    list_pool_events,
    list_pools,
    patch_pool,
    scale_pool,
)
from drover_client.api.rollouts import continue_rollout, get_rollout, list_revisions, plan_pool, rollback_pool
from drover_client.models import (
    Action,
    ApplyRequest,
    ApplyResult,
    CreatePool,
    EventList,
    MachineView,
    PlanView,
    PoolDocument,
    PoolDocumentKind,
    PoolList,
    PoolPatch,
    PoolSpecInput,
    PoolView,
    Problem,
    RollbackRequest,
    RolloutState,
    RolloutView,
    Scale,
    StrategyInput,
    StrategyPatch,
)
from drover_client.types import UNSET, Unset

TIMEOUT = 90.0


def fail(message):
    print(f"client_e2e: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def step(message):
    print(f"client_e2e: {message}", flush=True)


def no_unset(value, where):
    """Fails when a model (or one nested in it) left a field `Unset`: every
    field of a response model is one the server always sends."""
    if isinstance(value, Unset):
        fail(f"{where} is Unset, but the server always sends it")
    if isinstance(value, Problem):
        return
    if attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            if field.name != "additional_properties":
                no_unset(getattr(value, field.name), f"{where}.{field.name}")
        # Maps (labels, selectors) keep their keys there; objects may not.
        extra = getattr(value, "additional_properties", {})
        is_map = len(attrs.fields(type(value))) == 1
        check(is_map or not extra, f"{where} has fields the document does not name: {sorted(extra)}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            no_unset(item, f"{where}[{i}]")


def ok(response, model, status=200):
    """The parsed body of a successful answer, checked for Unset fields."""
    body = response.parsed
    check(response.status_code == status,
          f"expected {status}, got {response.status_code}: {response.content[:500]!r}")
    check(isinstance(body, model), f"expected a {model.__name__}, got {type(body).__name__}")
    no_unset(body, model.__name__)
    return body


def problem(response, status, field=None):
    """A typed problem+json answer with `status` (naming `field`, if given)."""
    check(response.status_code == status,
          f"expected {status}, got {response.status_code}: {response.content[:500]!r}")
    body = response.parsed
    check(isinstance(body, Problem), f"expected a typed Problem, got {type(body).__name__}")
    check(body.status == status and body.type_ and body.title, f"problem {body} is incomplete")
    check(response.headers.get("content-type", "").startswith("application/problem+json"),
          f"problem served as {response.headers.get('content-type')}")
    if field is not None:
        errors = [] if isinstance(body.errors, Unset) else body.errors
        check(any(e.field == field for e in errors), f"problem does not name {field!r}: {body}")
    return body


def wait(what, probe):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.2)
    fail(f"timed out waiting for {what}")


def main():
    base, token = sys.argv[1], sys.argv[2]
    verify = sys.argv[3] if len(sys.argv) > 3 else True
    c = AuthenticatedClient(
        base_url=base, token=token, raise_on_unexpected_status=True, timeout=30.0, verify_ssl=verify
    )
    if base.startswith("https://"):
        step(f"over HTTPS, trusting {verify}")
    name = "e2e"

    def pool():
        return ok(get_pool.sync_detailed(name, client=c), PoolView)

    def converged(replicas):
        p = pool()
        s = p.status
        done = (s.observed_generation == p.generation and s.replicas == replicas
                and s.ready_replicas == replicas and s.updated_replicas == replicas)
        return p if done else None

    def rollout():
        return ok(get_rollout.sync_detailed(name, client=c), RolloutView)

    def follow_rollout():
        """Approves each batch as the rollout waits for it, until it is
        complete; returns how many batches were approved."""
        deadline = time.monotonic() + TIMEOUT
        approvals = 0
        while True:
            r = rollout()
            if r.state == RolloutState.COMPLETE:
                return approvals
            check(time.monotonic() < deadline, f"rollout did not complete: {r}")
            if r.batch is not None and r.batch.awaiting_approval:
                approved = ok(continue_rollout.sync_detailed(name, client=c), RolloutView)
                approvals += 1
                check(approved.batch.approved_batches >= 2, f"batch approved: {approved.batch}")
            time.sleep(0.2)

    step("create a pool with batch approval")
    body = CreatePool(name=name, replicas=2, version="v1.29.2",
                      strategy=StrategyInput(max_surge=1, max_unavailable=0, batch_approval=True))
    created = create_pool.sync_detailed(client=c, body=body, idempotency_key="e2e-create-1")
    view = ok(created, PoolView, 201)
    check(created.headers.get("location") == f"/v1/pools/{name}", "201 names the pool in Location")
    check(created.headers.get("etag") == '"1"', "201 carries the generation as ETag")
    check(view.generation == 1 and view.replicas == 2 and view.strategy.batch_approval, f"created {view}")
    again = create_pool.sync_detailed(client=c, body=body, idempotency_key="e2e-create-1")
    check(again.status_code == 201 and again.headers.get("idempotent-replayed") == "true",
          "a retried create with the same Idempotency-Key is replayed")
    problem(create_pool.sync_detailed(client=c, body=body), 409)
    listed = ok(list_pools.sync_detailed(client=c, limit=10), PoolList)
    check(any(p.name == name for p in listed.items) and listed.next_cursor is None, "the pool is listed")

    step("wait until ready")
    wait("2 ready machines", lambda: converged(2))

    step("scale to 3")
    scaled = ok(scale_pool.sync_detailed(name, client=c, body=Scale(replicas=3)), PoolView)
    check(scaled.replicas == 3, "scaled")
    problem(scale_pool.sync_detailed(name, client=c, body=Scale(replicas=1001)), 422, "replicas")
    wait("3 ready machines", lambda: converged(3))

    step("plan without a body, and with a proposed version")
    plan = ok(plan_pool.sync_detailed(name, client=c), PlanView)
    check(plan.desired_image == "kindest/node:v1.29.2", f"plan of the pool as it is: {plan}")
    proposed = ok(plan_pool.sync_detailed(name, client=c, body=PoolPatch(version="v1.30.0")), PlanView)
    check(proposed.desired_image == "kindest/node:v1.30.0", f"plan of a proposed version: {proposed}")
    problem(plan_pool.sync_detailed(name, client=c, body=PoolPatch(version="1.30")), 422, "version")

    step("pause and resume")
    etag = get_pool.sync_detailed(name, client=c).headers["etag"]
    paused = ok(patch_pool.sync_detailed(name, client=c, body=PoolPatch(paused=True), if_match=etag), PoolView)
    check(paused.paused, "paused")
    problem(patch_pool.sync_detailed(name, client=c, body=PoolPatch(paused=False), if_match=etag), 412)
    resumed = ok(patch_pool.sync_detailed(name, client=c, body=PoolPatch(paused=False)), PoolView)
    check(not resumed.paused, "resumed")

    step("roll out a new version with If-Match; approve its batches")
    etag = get_pool.sync_detailed(name, client=c).headers["etag"]
    rolled = patch_pool.sync_detailed(name, client=c, body=PoolPatch(version="v1.30.0"), if_match=etag)
    view = ok(rolled, PoolView)
    check(view.revision == 2 and view.desired_image == "kindest/node:v1.30.0", f"rollout started: {view}")
    first = rollout()
    # Counts right after the change are observed now, so they agree with it.
    check(first.counts.outdated + first.counts.updated == first.counts.total, f"counts add up: {first.counts}")
    check(first.state != RolloutState.COMPLETE and first.remaining > 0, f"a rollout is under way: {first}")
    approvals = follow_rollout()
    check(approvals >= 1, "batch approval paused the rollout at least once")
    wait("3 machines on v1.30.0", lambda: converged(3))
    problem(continue_rollout.sync_detailed(name, client=c), 409)

    step("roll back (no body: the previous revision)")
    back = rollback_pool.sync_detailed(name, client=c)
    view = ok(back, PoolView, 202)
    check(back.headers.get("location") == f"/v1/pools/{name}" and back.headers.get("etag"), "202 has Location, ETag")
    check(view.desired_image == "kindest/node:v1.29.2", f"rolled back: {view}")
    revisions = list_revisions.sync(name, client=c)
    no_unset(revisions, "RevisionList")
    check(revisions.current == 3, f"rollback made revision 3: {revisions}")
    problem(rollback_pool.sync_detailed(name, client=c, body=RollbackRequest(revision=99)), 422, "revision")
    follow_rollout()

    step("events, a page at a time")
    seen, cursor = [], UNSET
    while True:
        page = ok(list_pool_events.sync_detailed(name, client=c, limit=3, cursor=cursor), EventList)
        seen.extend(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    reasons = [e.reason for e in seen]
    ids = [e.id for e in seen]
    check(ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids), "events newest first, none repeated")
    for reason in ["Created", "Scaled", "SpecChanged", "RolloutStarted", "BatchApproved", "RolledBack"]:
        check(reason in reasons, f"event {reason} is listed: {reasons}")
    problem(list_pool_events.sync_detailed(name, client=c, cursor="!!"), 422, "cursor")

    step("delete a machine")
    wait("3 machines on v1.29.2", lambda: converged(3))
    check(pool().desired_image == "kindest/node:v1.29.2", "the rollback is done")
    machines = list_machines.sync(name, client=c)
    no_unset(machines, "MachineList")
    # A marked machine goes first on the next scale-down...
    first, second = machines.items[0].name, machines.items[1].name
    marked = request_machine_deletion.sync_detailed(name, first, client=c)
    check(ok(marked, MachineView).delete_requested, "the machine is marked")
    ok(scale_pool.sync_detailed(name, client=c, body=Scale(replicas=2)), PoolView)
    wait(f"{first} gone", lambda: get_machine.sync_detailed(name, first, client=c).status_code == 404)
    wait("2 machines", lambda: converged(2))
    # ...and DELETE removes a chosen one at once, lowering replicas.
    deleted = delete_machine.sync_detailed(name, second, client=c)
    check(ok(deleted, MachineView, 202).delete_requested, "machine deletion accepted")
    check(deleted.headers.get("location") == f"/v1/pools/{name}/machines/{second}", "202 names the machine")
    check(pool().replicas == 1, "removing a machine lowers replicas")
    wait(f"{second} gone", lambda: get_machine.sync_detailed(name, second, client=c).status_code == 404)
    wait("1 machine", lambda: converged(1))

    step("typed problems")
    problem(get_pool.sync_detailed("missing", client=c), 404)
    problem(patch_pool.sync_detailed(name, client=c, body=PoolPatch(replicas=-1)), 422, "replicas")
    problem(patch_pool.sync_detailed(name, client=c, body=PoolPatch(replicas=3), if_match='"1"'), 412)

    step("apply a fleet: a dry run, the apply, the same again, a bad document, a prune")

    def doc(pool_name, replicas):
        return PoolDocument(kind=PoolDocumentKind.POOL, name=pool_name,
                            spec=PoolSpecInput(replicas=replicas, version="v1.29.2"))

    def applied(response):
        return ok(response, ApplyResult)

    fleet = [doc("fleet-a", 1), doc("fleet-b", 2)]
    dry = applied(apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=fleet, dry_run=True)))
    check(dry.dry_run and dry.changed and dry.revision is None, f"a dry run of a new set: {dry}")
    check([o.action for o in dry.objects] == [Action.CREATE, Action.CREATE], f"two creations planned: {dry.objects}")
    problem(get_pool.sync_detailed("fleet-a", client=c), 404)
    done = apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=fleet),
                                     idempotency_key="e2e-apply-1")
    result = applied(done)
    check(done.headers.get("etag") == '"1"' and result.revision == 1, f"applied as revision 1: {result}")
    check(result.objects[1].generation == 1 and result.objects[1].revision == 1, f"generations: {result.objects}")
    replayed = apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=fleet),
                                         idempotency_key="e2e-apply-1")
    check(replayed.headers.get("idempotent-replayed") == "true", "a retried apply with the same key is replayed")
    same = applied(apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=fleet),
                                             if_match='"1"'))
    check(not same.changed and same.summary.unchanged == 2, f"the same apply again changes nothing: {same}")
    problem(apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=fleet), if_match='"9"'),
            412)
    problem(apply_fleet.sync_detailed(client=c, body=ApplyRequest(apply_set="e2e", documents=[doc("fleet-a", 1001)])),
            422, "documents[0].spec.replicas")
    pruned = applied(apply_fleet.sync_detailed(
        client=c, body=ApplyRequest(apply_set="e2e", documents=[doc("fleet-a", 2)], prune=True)))
    check([(o.name, o.action) for o in pruned.objects] == [("fleet-a", Action.UPDATE), ("fleet-b", Action.DELETE)],
          f"an update and a prune: {pruned.objects}")
    change = pruned.objects[0].changes[0]
    check((change.path, change.before, change.after) == ("replicas", 1, 2), f"the diff: {change}")

    step("delete the pool")
    gone = delete_pool.sync_detailed(name, client=c)
    check(ok(gone, PoolView, 202).phase.value == "deleting", "the pool is deleting")
    wait("the pool gone", lambda: get_pool.sync_detailed(name, client=c).status_code == 404)
    step("ok")


if __name__ == "__main__":
    main()
