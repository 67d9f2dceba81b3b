# SPDX-License-Identifier: Apache-2.0
"""Prints what TensorBoard's own event reader finds in one run's folder.

Usage: read_events.py RUN_DIR. One line per item:
  scalar TAG STEP VALUE            each scalar event, in the reader's order
  hparam NAME KIND VALUE           SessionStartInfo.hparams (KIND: number_value, string_value, bool_value)
  hparam_info NAME TYPE            Experiment.hparam_infos (TYPE: DATA_TYPE_...)
  metric_info TAG                  Experiment.metric_infos
  session_end STATUS               SessionEndInfo.status (STATUS_...)
"""
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print("scalar", tag, e.step, repr(e.value))
try:
    hparams = acc.PluginTagToContent("hparams")
except KeyError:  # the run has no hparams summaries
    hparams = {}
for tag, blob in sorted(hparams.items()):
    data = plugin_data_pb2.HParamsPluginData.FromString(blob)
    kind = data.WhichOneof("data")
    if kind == "session_start_info":
        for name, value in sorted(data.session_start_info.hparams.items()):
            which = value.WhichOneof("kind")
            print("hparam", name, which, getattr(value, which))
    elif kind == "experiment":
        for info in data.experiment.hparam_infos:
            print("hparam_info", info.name, api_pb2.DataType.Name(info.type))
        for info in data.experiment.metric_infos:
            print("metric_info", info.name.tag)
    elif kind == "session_end_info":
        print("session_end", api_pb2.Status.Name(data.session_end_info.status))
