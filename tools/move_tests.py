"""Move the test files into folders that mirror the package's layers (issue 36), and rewrite
every reference to their old paths.

``MOVES`` maps each old path under ``tests/`` to its new one. Running the tool moves what is
still at an old path (``git mv``), rewrites ``tests/<old>`` mentions in code, docs, TOML and
the Makefile, and fixes the moved files' ``Path(__file__).parents[k]`` to point at the same
folder from the new place. ``--check`` lists what a run would still change and exits 1 if
anything; a second run changes nothing. Run it on any branch written against the old paths.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MOVES: dict[str, str] = {
    # the whole package, and the top-level base modules
    "unit/test_layering.py": "test_layering.py",
    "unit/test_old_module_paths.py": "test_old_module_paths.py",
    "unit/test_codes_by_constant.py": "test_codes_by_constant.py",
    "unit/test_crashpoints.py": "test_crashpoints.py",
    "unit/test_leave.py": "test_collective_leave.py",
    # tools/ and benchmarks/
    "unit/test_codes_to_constants.py": "tools/test_codes_to_constants.py",
    "unit/test_diagnosis_table_tool.py": "tools/test_diagnosis_table_tool.py",
    "integration/test_scale_bench.py": "tools/test_scale_bench.py",
    # format/
    "unit/test_manifest.py": "format/test_manifest.py",
    "unit/test_fuzz_manifest.py": "format/test_manifest_fuzz.py",
    "unit/test_partial_manifest.py": "format/test_partial_manifest.py",
    "unit/test_rank_manifest.py": "format/test_rank_manifest.py",
    "unit/test_records.py": "format/test_records.py",
    "unit/test_fuzz_records.py": "format/test_records_fuzz.py",
    "unit/test_fuzz_tree.py": "format/test_tree_fuzz.py",
    "unit/test_signing.py": "format/test_signing.py",
    "unit/storage/test_dtypes.py": "format/test_dtypes.py",
    # storage/
    "unit/storage/test_coverage_check.py": "storage/test_coverage_check.py",
    "unit/storage/test_dcp_listed.py": "storage/test_dcp_listed.py",
    "unit/storage/test_dcp_shard.py": "storage/test_dcp_shard.py",
    "unit/storage/test_lease.py": "storage/test_lease.py",
    "unit/storage/test_lock.py": "storage/test_lock.py",
    "unit/storage/test_read_path.py": "storage/test_read_path.py",
    "unit/storage/test_roundtrip.py": "storage/test_roundtrip.py",
    "unit/storage/test_run_files.py": "storage/test_run_files.py",
    "unit/test_writer_at_open.py": "storage/test_writer_at_open.py",
    "integration/test_lease_requeue.py": "storage/test_lease_requeue.py",
    "integration/test_object_store.py": "storage/test_object_store.py",
    "integration/test_transient.py": "storage/test_transient_errors.py",
    # capture/
    "unit/capture/test_capture_fp8.py": "capture/test_capture_fp8.py",
    "unit/capture/test_capture_optim.py": "capture/test_capture_optim.py",
    "unit/capture/test_capture_progress_parallel_env.py": "capture/test_capture_progress_parallel_env.py",
    "unit/capture/test_capture_rng.py": "capture/test_capture_rng.py",
    "unit/capture/test_capture_sampler.py": "capture/test_capture_sampler.py",
    "unit/capture/test_capture_scaler.py": "capture/test_capture_scaler.py",
    "unit/capture/test_capture_scheduler.py": "capture/test_capture_scheduler.py",
    "unit/capture/test_problems.py": "capture/test_problems.py",
    "unit/test_sampler.py": "capture/test_resumable_sampler.py",
    "unit/test_load_into.py": "capture/test_load_into.py",
    "unit/test_perrank.py": "capture/test_perrank.py",
    "integration/distributed/test_perrank_buffers.py": "capture/test_perrank_buffers.py",
    "integration/test_dataloader_resume.py": "capture/test_dataloader_resume.py",
    "integration/test_trainstate_inprocess.py": "capture/test_trainstate_inprocess.py",
    # checkpoint/
    "unit/test_io_step.py": "checkpoint/test_io_step.py",
    "unit/test_lookahead.py": "checkpoint/test_lookahead.py",
    "unit/test_replicas.py": "checkpoint/test_replicas.py",
    "unit/test_listing_ranks.py": "checkpoint/test_listing_ranks.py",
    "unit/test_read_classifier.py": "checkpoint/test_read_classifier.py",
    "unit/test_foreign_loads.py": "checkpoint/test_foreign_loads.py",
    "integration/test_crash_points.py": "checkpoint/test_crash_points.py",
    "integration/test_crash_safety.py": "checkpoint/test_crash_safety.py",
    "integration/test_keyed_restore.py": "checkpoint/test_keyed_restore.py",
    "integration/test_dcp_storage.py": "checkpoint/test_dcp_storage.py",
    "integration/test_dcp_coverage.py": "checkpoint/test_dcp_coverage.py",
    "integration/test_dcp_agreement.py": "checkpoint/test_dcp_agreement.py",
    "integration/test_exact_resume.py": "checkpoint/test_exact_resume.py",
    "integration/distributed/test_commit_matrix.py": "checkpoint/test_commit_matrix.py",
    "integration/distributed/test_dcp_ranks.py": "checkpoint/test_dcp_ranks.py",
    "integration/distributed/test_replica_ranks.py": "checkpoint/test_replica_ranks.py",
    "integration/distributed/test_rank_manifests.py": "checkpoint/test_rank_manifests.py",
    "integration/distributed/test_old_format.py": "checkpoint/test_old_format.py",
    "integration/distributed/test_collective_traffic.py": "checkpoint/test_collective_traffic.py",
    # verify/
    "unit/verify/test_checks_implied.py": "verify/test_checks_implied.py",
    "unit/verify/test_checks_state.py": "verify/test_checks_state.py",
    "unit/verify/test_checks_state_fuzz.py": "verify/test_checks_state_fuzz.py",
    "unit/verify/test_registry.py": "verify/test_registry.py",
    "unit/test_bad_input.py": "verify/test_bad_input.py",
    "unit/test_hostile_manifest.py": "verify/test_hostile_manifest.py",
    "unit/test_on_inconsistent.py": "verify/test_on_inconsistent.py",
    "unit/test_statediff.py": "verify/test_statediff.py",
    "unit/test_verify_workers.py": "verify/test_verify_workers.py",
    "integration/test_restorable_as_saved.py": "verify/test_restorable_as_saved.py",
    "integration/test_trust.py": "verify/test_forged_checkpoints_never_execute.py",
    "integration/test_verdict_audit.py": "verify/test_verdict_audit.py",
    "integration/test_verify_during_rotation.py": "verify/test_verify_during_rotation.py",
    "integration/distributed/test_verify_torchrun.py": "verify/test_verify_torchrun.py",
    # verify/foreign/: the readers of other frameworks' checkpoints
    "unit/test_foreign_unreadable.py": "verify/foreign/test_foreign_unreadable.py",
    "integration/interop/test_allow_lists.py": "verify/foreign/test_allow_lists.py",
    "integration/interop/test_dcp_layouts.py": "verify/foreign/test_dcp_layouts.py",
    "integration/interop/test_expect.py": "verify/foreign/test_expect.py",
    "integration/interop/test_formats.py": "verify/foreign/test_formats.py",
    "integration/interop/test_handrolled.py": "verify/foreign/test_handrolled.py",
    "integration/interop/test_hostile.py": "verify/foreign/test_hostile_foreign.py",
    "integration/interop/test_implied.py": "verify/foreign/test_implied.py",
    "integration/interop/test_inflate_bound.py": "verify/foreign/test_inflate_bound.py",
    "integration/interop/test_pickle_audit.py": "verify/foreign/test_pickle_audit.py",
    "integration/interop/test_same_checks.py": "verify/foreign/test_same_checks.py",
    # signals/
    "unit/test_guard.py": "signals/test_guard.py",
    "unit/test_observe.py": "signals/test_observe.py",
    "unit/test_recorder.py": "signals/test_recorder.py",
    "unit/test_recovery.py": "signals/test_recovery.py",
    "unit/test_rngtrace.py": "signals/test_rngtrace.py",
    "unit/test_stability.py": "signals/test_stability.py",
    "unit/test_watch_state.py": "signals/test_watch_state.py",
    "integration/test_guard_catalogue.py": "signals/test_guard_catalogue.py",
    "integration/test_guard_readme_snippet.py": "signals/test_guard_readme_snippet.py",
    "integration/distributed/test_recovery_multirank.py": "signals/test_recovery_multirank.py",
    # run/
    "unit/test_manager.py": "run/test_manager.py",
    "unit/test_manager_readonly_dir.py": "run/test_manager_readonly_dir.py",
    "unit/test_reader_cannot_delete.py": "run/test_reader_cannot_delete.py",
    "unit/test_delete_corrupt.py": "run/test_delete_corrupt.py",
    "unit/test_resume_reject.py": "run/test_resume_reject.py",
    "unit/test_retain_loop.py": "run/test_retain_loop.py",
    "unit/test_rotation.py": "run/test_rotation.py",
    "unit/test_run_layer.py": "run/test_run_layer.py",
    "unit/test_run_review_fixes.py": "run/test_adopted_steps_and_run_lock.py",
    "unit/test_saving.py": "run/test_saving.py",
    "unit/test_trajectory.py": "run/test_trajectory.py",
    "unit/test_recovery_host.py": "run/test_recovery_host.py",
    "integration/test_manager_faults.py": "run/test_manager_faults.py",
    "integration/test_preemption.py": "run/test_preemption.py",
    "integration/test_rollback.py": "run/test_rollback.py",
    "integration/test_true_picture.py": "run/test_rot_and_faults_keep_the_good_one.py",
    "integration/distributed/test_multirank.py": "run/test_multirank.py",
    "integration/distributed/test_resume_choice.py": "run/test_resume_choice.py",
    # integrations/ (framework runs, their crash matrix, the drill's environment contract)
    "unit/drill/test_contract.py": "integrations/test_drill_env.py",
    "integration/test_crash_matrix.py": "integrations/test_crash_matrix.py",
    "integration/interop/test_hf_cli.py": "integrations/test_hf_cli.py",
    "integration/interop/test_hf_drill.py": "integrations/test_hf_drill.py",
    "integration/interop/test_hf_run.py": "integrations/test_hf_run.py",
    "integration/interop/test_lightning.py": "integrations/test_lightning.py",
    "integration/interop/test_lightning_data.py": "integrations/test_lightning_data.py",
    "integration/interop/test_lightning_lock.py": "integrations/test_lightning_lock.py",
    "integration/interop/test_resume_loads.py": "integrations/test_resume_loads.py",
    "integration/interop/test_run_recovery.py": "integrations/test_run_recovery.py",
    "integration/interop/test_torchtitan.py": "integrations/test_torchtitan.py",
    "integration/distributed/test_titan_ranks.py": "integrations/test_titan_ranks.py",
    # drill/
    "unit/drill/test_artefacts.py": "drill/test_artefacts.py",
    "unit/drill/test_compare.py": "drill/test_compare.py",
    "unit/drill/test_diagnose.py": "drill/test_diagnose.py",
    "unit/drill/test_end_state_judge.py": "drill/test_end_state_judge.py",
    "unit/drill/test_evidence_first.py": "drill/test_evidence_first.py",
    "unit/drill/test_framework_snapshot.py": "drill/test_framework_snapshot.py",
    "unit/drill/test_launch.py": "drill/test_launch.py",
    "unit/drill/test_noise.py": "drill/test_noise.py",
    "unit/drill/test_rows.py": "drill/test_rows.py",
    "unit/drill/test_runner.py": "drill/test_runner.py",
    "unit/drill/test_stats.py": "drill/test_stats.py",
    "integration/test_drill.py": "drill/test_drill.py",
    "integration/test_drill_rows.py": "drill/test_drill_rows.py",
    "integration/test_end_state.py": "drill/test_end_state.py",
    "integration/test_evidence_drills.py": "drill/test_evidence_drills.py",
    "integration/test_noisy_drill.py": "drill/test_noisy_drill.py",
    "integration/test_diagnosis_table.py": "drill/test_diagnosis_table.py",
    "integration/test_every_artefact.py": "drill/test_every_artefact.py",
    # cli/ (renamed for what they prove)
    "cli/test_newcomer.py": "cli/test_first_afternoon_edges.py",
    "cli/test_newcomer_22.py": "cli/test_next_newcomer_edges.py",
    "integration/interop/test_adopt_cli.py": "cli/test_adopt_cli.py",
    # examples/ (the bundled tiny LM and the auto-recovery example)
    "integration/test_tiny_lm_runs.py": "examples/test_tiny_lm_runs.py",
    "integration/test_auto_recover_example.py": "examples/test_auto_recover_example.py",
    # docs/
    "integration/test_readme_loop.py": "docs/test_readme_loop.py",
    # shared support: training scripts, gloo workers, framework checkpoint fixtures
    "integration/interop/conftest.py": "framework_checkpoints.py",
    "integration/distributed/_launch.py": "ranks/_launch.py",
    "integration/distributed/_worker.py": "ranks/_worker.py",
    "integration/distributed/_dcp_worker.py": "ranks/_dcp_worker.py",
    "integration/distributed/_perrank_worker.py": "ranks/_perrank_worker.py",
    "integration/distributed/_recovery_worker.py": "ranks/_recovery_worker.py",
    "integration/distributed/_replica_worker.py": "ranks/_replica_worker.py",
    "integration/distributed/_resume_worker.py": "ranks/_resume_worker.py",
    "integration/distributed/_titan_worker.py": "ranks/_titan_worker.py",
    "integration/aug_script.py": "scripts/aug_script.py",
    "integration/char_script.py": "scripts/char_script.py",
    "integration/drill_script.py": "scripts/drill_script.py",
    "integration/ema_export_script.py": "scripts/ema_export_script.py",
    "integration/end_state_script.py": "scripts/end_state_script.py",
    "integration/loader_script.py": "scripts/loader_script.py",
    "integration/noisy_script.py": "scripts/noisy_script.py",
    "integration/preempt_script.py": "scripts/preempt_script.py",
    "integration/rows_script.py": "scripts/rows_script.py",
    "integration/scripts/busy_trainer.py": "scripts/busy_trainer.py",
}
for _name in ("acc_steps", "fabric_loader", "fabric_tiny", "hf_accelerate_train", "hf_ema",
              "hf_trainer_classifier", "hf_trainer_train", "lit_datamodule", "lit_ema",
              "lit_tiny", "titan_train"):
    MOVES[f"integration/interop/scripts/{_name}.py"] = f"scripts/{_name}.py"

FOLDERS: dict[str, str] = {
    "integration/interop/scripts": "scripts",
    "integration/scripts": "scripts",
    "integration/distributed": "ranks",
}
"""Old folders mentioned as such (after the files in them)."""

TEXT = (".py", ".md", ".toml", ".txt", ".cfg", ".json", ".sh", "Makefile", ".yml", ".yaml")
SKIP = {"tools/move_tests.py"}
"""Not rewritten: this table; nor tests/data/, whose records say what wrote them, then."""
PARENTS = re.compile(r"Path\(__file__\)((?:\.resolve\(\))?)\.parents\[(\d)\]")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines()
            if p.endswith(TEXT) and p not in SKIP and not p.startswith("tests/data/")]


def _rewrite_paths(text: str) -> str:
    pairs = sorted(MOVES.items(), key=lambda kv: -len(kv[0])) + sorted(FOLDERS.items())
    for old, new in pairs:
        text = re.sub(rf"tests/{re.escape(old)}(?![\w/])", f"tests/{new}", text)
    return text


def _rewrite_parents(text: str, old: str, new: str) -> str:
    """``Path(__file__).parents[k]`` of a file moved from tests/OLD to tests/NEW, same target."""
    old_path, new_path = Path("tests") / old, Path("tests") / new

    def fix(m: re.Match[str]) -> str:
        target = old_path.parents[int(m.group(2))]
        for k, p in enumerate(new_path.parents):
            if p == target:
                return f"Path(__file__){m.group(1)}.parents[{k}]"
        print(f"tests/{new}: {m.group(0)} pointed at {target}, not above the new place: fix it by hand")
        return m.group(0)

    return PARENTS.sub(fix, text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="list what would change; exit 1 if anything")
    args = ap.parse_args()
    todo: list[str] = []
    for old, new in MOVES.items():
        src, dst = ROOT / "tests" / old, ROOT / "tests" / new
        if src.exists() and not dst.exists():
            todo.append(f"move tests/{old} -> tests/{new}")
            if not args.check:
                dst.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
                dst.write_text(_rewrite_parents(dst.read_text(), old, new))
    for rel in _tracked():
        path = ROOT / rel
        if not path.exists():
            continue
        text = path.read_text()
        new_text = _rewrite_paths(text)
        if new_text != text:
            todo.append(f"rewrite {rel}")
            if not args.check:
                path.write_text(new_text)
    print("\n".join(todo) or "nothing to change")
    return 1 if args.check and todo else 0


if __name__ == "__main__":
    sys.exit(main())
