"""Which data manifests can hold a file that a snapshot's changed delete files apply to.

A snapshot that adds (or drops) delete files changes the live rows of data
files it keeps, and detect must find those files among every live data file
of the snapshot. A delete file reaches only data files of its own spec and
partition (position deletes and DVs name files of their partition; an
equality delete of a partitioned spec is scoped to its partition), so a data
manifest whose partition summaries rule out every changed delete's partition
cannot hold one: it is not read. Only a global equality delete (an
unpartitioned spec) can reach every manifest, and then none is skipped.

Pruning never changes the result; it saves reading manifests of a table
whose manifests are clustered by partition (appends by day, say), where one
day's upserts would otherwise read the manifests of every day.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from pyiceberg.expressions import AlwaysFalse, And, BooleanExpression, EqualTo, IsNull, Or
from pyiceberg.expressions.visitors import manifest_evaluator
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema


def _partition_equals(spec: PartitionSpec, data_file: DataFile) -> BooleanExpression:
    terms: list[BooleanExpression] = []
    for i, field in enumerate(spec.fields):
        value = data_file.partition[i]
        terms.append(IsNull(field.name) if value is None else EqualTo(field.name, value))
    return And(*terms) if len(terms) > 1 else terms[0]


def manifest_filter(
    delete_files: Iterable[DataFile], specs: Mapping[int, PartitionSpec], schema: Schema
) -> Callable[[ManifestFile], bool]:
    """A predicate: may this data manifest hold a file one of ``delete_files`` applies to?"""
    scopes: dict[int, list[DataFile]] = {}
    for delete_file in delete_files:
        spec = specs.get(int(delete_file.spec_id))
        if spec is None or not spec.fields:
            return lambda _manifest: True  # a global equality delete (or an unknown spec): every manifest
        scopes.setdefault(spec.spec_id, []).append(delete_file)
    evaluators: dict[int, Callable[[ManifestFile], bool]] = {}
    for spec_id, files in scopes.items():
        spec = specs[spec_id]
        try:
            expression: BooleanExpression = AlwaysFalse()
            for delete_file in files:
                expression = Or(expression, _partition_equals(spec, delete_file))
            evaluators[spec_id] = manifest_evaluator(spec, schema, expression)
        except Exception:  # a partition value or field the expression cannot bind: read every manifest
            evaluators[spec_id] = lambda _manifest: True

    def may_hold(manifest: ManifestFile) -> bool:
        evaluate = evaluators.get(manifest.partition_spec_id)
        if evaluate is None:
            return False  # no changed delete is of this manifest's spec
        try:
            return evaluate(manifest)
        except Exception:  # summaries it cannot compare: read the manifest
            return True

    return may_hold
