"""The Open Inference Protocol's gRPC messages, from ``open_inference.proto`` beside this module.

The messages are built from the compiled ``.proto`` (a serialized
``FileDescriptorSet``, below) in a descriptor pool of their own, not
protobuf's default pool: tritonclient registers Triton's messages of the same
names (``inference.ModelInferRequest``...) in the default pool, and a client
and the server in one process (a notebook, the tests) would then clash. The
wire knows field numbers, not type names: ours are those of KServe's and
Triton's files, so their clients' messages parse as they are.

Why not the generated modules tritonclient ships (``tritonclient.grpc.service_pb2``):
importing them runs the client package (python-rapidjson, urllib3, ml-dtypes),
the package caps protobuf below the versions TensorFlow takes (tritonclient 2.73:
``protobuf<7``), and Triton's file carries twenty RPCs' messages and its model
configuration (54 KB of code). This file is 5 KB of descriptor and needs only protobuf, which
``tensorflow-serving-api`` brings already.

After a change to ``open_inference.proto``, regenerate ``_COMPILED`` with
grpcio-tools (a development tool, not a dependency)::

    python -m grpc_tools.protoc -I lifecycle/server/kserve --descriptor_set_out=/dev/stdout \
        lifecycle/server/kserve/open_inference.proto | base64 -w 92
"""

from __future__ import annotations

import base64

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["SERVICE", "methods"]

#: The gRPC service's full name: methods are ``/inference.GRPCInferenceService/<Name>``.
SERVICE = "inference.GRPCInferenceService"

# protoc's --descriptor_set_out of open_inference.proto, base64.
_COMPILED = (
    "CvEnChRvcGVuX2luZmVyZW5jZS5wcm90bxIJaW5mZXJlbmNlIhMKEVNlcnZlckxpdmVSZXF1ZXN0IigKElNlcnZlckxp"
    "dmVSZXNwb25zZRISCgRsaXZlGAEgASgIUgRsaXZlIhQKElNlcnZlclJlYWR5UmVxdWVzdCIrChNTZXJ2ZXJSZWFkeVJl"
    "c3BvbnNlEhQKBXJlYWR5GAEgASgIUgVyZWFkeSJBChFNb2RlbFJlYWR5UmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1l"
    "EhgKB3ZlcnNpb24YAiABKAlSB3ZlcnNpb24iKgoSTW9kZWxSZWFkeVJlc3BvbnNlEhQKBXJlYWR5GAEgASgIUgVyZWFk"
    "eSIXChVTZXJ2ZXJNZXRhZGF0YVJlcXVlc3QiZgoWU2VydmVyTWV0YWRhdGFSZXNwb25zZRISCgRuYW1lGAEgASgJUgRu"
    "YW1lEhgKB3ZlcnNpb24YAiABKAlSB3ZlcnNpb24SHgoKZXh0ZW5zaW9ucxgDIAMoCVIKZXh0ZW5zaW9ucyJEChRNb2Rl"
    "bE1ldGFkYXRhUmVxdWVzdBISCgRuYW1lGAEgASgJUgRuYW1lEhgKB3ZlcnNpb24YAiABKAlSB3ZlcnNpb24izwIKFU1v"
    "ZGVsTWV0YWRhdGFSZXNwb25zZRISCgRuYW1lGAEgASgJUgRuYW1lEhoKCHZlcnNpb25zGAIgAygJUgh2ZXJzaW9ucxIa"
    "CghwbGF0Zm9ybRgDIAEoCVIIcGxhdGZvcm0SRwoGaW5wdXRzGAQgAygLMi8uaW5mZXJlbmNlLk1vZGVsTWV0YWRhdGFS"
    "ZXNwb25zZS5UZW5zb3JNZXRhZGF0YVIGaW5wdXRzEkkKB291dHB1dHMYBSADKAsyLy5pbmZlcmVuY2UuTW9kZWxNZXRh"
    "ZGF0YVJlc3BvbnNlLlRlbnNvck1ldGFkYXRhUgdvdXRwdXRzGlYKDlRlbnNvck1ldGFkYXRhEhIKBG5hbWUYASABKAlS"
    "BG5hbWUSGgoIZGF0YXR5cGUYAiABKAlSCGRhdGF0eXBlEhQKBXNoYXBlGAMgAygDUgVzaGFwZSLXAQoOSW5mZXJQYXJh"
    "bWV0ZXISHwoKYm9vbF9wYXJhbRgBIAEoCEgAUglib29sUGFyYW0SIQoLaW50NjRfcGFyYW0YAiABKANIAFIKaW50NjRQ"
    "YXJhbRIjCgxzdHJpbmdfcGFyYW0YAyABKAlIAFILc3RyaW5nUGFyYW0SIwoMZG91YmxlX3BhcmFtGAQgASgBSABSC2Rv"
    "dWJsZVBhcmFtEiMKDHVpbnQ2NF9wYXJhbRgFIAEoBEgAUgt1aW50NjRQYXJhbUISChBwYXJhbWV0ZXJfY2hvaWNlIsMC"
    "ChNJbmZlclRlbnNvckNvbnRlbnRzEiMKDWJvb2xfY29udGVudHMYASADKAhSDGJvb2xDb250ZW50cxIhCgxpbnRfY29u"
    "dGVudHMYAiADKAVSC2ludENvbnRlbnRzEiUKDmludDY0X2NvbnRlbnRzGAMgAygDUg1pbnQ2NENvbnRlbnRzEiMKDXVp"
    "bnRfY29udGVudHMYBCADKA1SDHVpbnRDb250ZW50cxInCg91aW50NjRfY29udGVudHMYBSADKARSDnVpbnQ2NENvbnRl"
    "bnRzEiMKDWZwMzJfY29udGVudHMYBiADKAJSDGZwMzJDb250ZW50cxIjCg1mcDY0X2NvbnRlbnRzGAcgAygBUgxmcDY0"
    "Q29udGVudHMSJQoOYnl0ZXNfY29udGVudHMYCCADKAxSDWJ5dGVzQ29udGVudHMinQgKEU1vZGVsSW5mZXJSZXF1ZXN0"
    "Eh0KCm1vZGVsX25hbWUYASABKAlSCW1vZGVsTmFtZRIjCg1tb2RlbF92ZXJzaW9uGAIgASgJUgxtb2RlbFZlcnNpb24S"
    "DgoCaWQYAyABKAlSAmlkEkwKCnBhcmFtZXRlcnMYBCADKAsyLC5pbmZlcmVuY2UuTW9kZWxJbmZlclJlcXVlc3QuUGFy"
    "YW1ldGVyc0VudHJ5UgpwYXJhbWV0ZXJzEkUKBmlucHV0cxgFIAMoCzItLmluZmVyZW5jZS5Nb2RlbEluZmVyUmVxdWVz"
    "dC5JbmZlcklucHV0VGVuc29yUgZpbnB1dHMSUQoHb3V0cHV0cxgGIAMoCzI3LmluZmVyZW5jZS5Nb2RlbEluZmVyUmVx"
    "dWVzdC5JbmZlclJlcXVlc3RlZE91dHB1dFRlbnNvclIHb3V0cHV0cxIsChJyYXdfaW5wdXRfY29udGVudHMYByADKAxS"
    "EHJhd0lucHV0Q29udGVudHMazQIKEEluZmVySW5wdXRUZW5zb3ISEgoEbmFtZRgBIAEoCVIEbmFtZRIaCghkYXRhdHlw"
    "ZRgCIAEoCVIIZGF0YXR5cGUSFAoFc2hhcGUYAyADKANSBXNoYXBlEl0KCnBhcmFtZXRlcnMYBCADKAsyPS5pbmZlcmVu"
    "Y2UuTW9kZWxJbmZlclJlcXVlc3QuSW5mZXJJbnB1dFRlbnNvci5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMSOgoI"
    "Y29udGVudHMYBSABKAsyHi5pbmZlcmVuY2UuSW5mZXJUZW5zb3JDb250ZW50c1IIY29udGVudHMaWAoPUGFyYW1ldGVy"
    "c0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2"
    "YWx1ZToCOAEa8wEKGkluZmVyUmVxdWVzdGVkT3V0cHV0VGVuc29yEhIKBG5hbWUYASABKAlSBG5hbWUSZwoKcGFyYW1l"
    "dGVycxgCIAMoCzJHLmluZmVyZW5jZS5Nb2RlbEluZmVyUmVxdWVzdC5JbmZlclJlcXVlc3RlZE91dHB1dFRlbnNvci5Q"
    "YXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMaWAoPUGFyYW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZh"
    "bHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEaWAoPUGFyYW1ldGVyc0VudHJ5EhAK"
    "A2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEi"
    "3wUKEk1vZGVsSW5mZXJSZXNwb25zZRIdCgptb2RlbF9uYW1lGAEgASgJUgltb2RlbE5hbWUSIwoNbW9kZWxfdmVyc2lv"
    "bhgCIAEoCVIMbW9kZWxWZXJzaW9uEg4KAmlkGAMgASgJUgJpZBJNCgpwYXJhbWV0ZXJzGAQgAygLMi0uaW5mZXJlbmNl"
    "Lk1vZGVsSW5mZXJSZXNwb25zZS5QYXJhbWV0ZXJzRW50cnlSCnBhcmFtZXRlcnMSSQoHb3V0cHV0cxgFIAMoCzIvLmlu"
    "ZmVyZW5jZS5Nb2RlbEluZmVyUmVzcG9uc2UuSW5mZXJPdXRwdXRUZW5zb3JSB291dHB1dHMSLgoTcmF3X291dHB1dF9j"
    "b250ZW50cxgGIAMoDFIRcmF3T3V0cHV0Q29udGVudHMa0AIKEUluZmVyT3V0cHV0VGVuc29yEhIKBG5hbWUYASABKAlS"
    "BG5hbWUSGgoIZGF0YXR5cGUYAiABKAlSCGRhdGF0eXBlEhQKBXNoYXBlGAMgAygDUgVzaGFwZRJfCgpwYXJhbWV0ZXJz"
    "GAQgAygLMj8uaW5mZXJlbmNlLk1vZGVsSW5mZXJSZXNwb25zZS5JbmZlck91dHB1dFRlbnNvci5QYXJhbWV0ZXJzRW50"
    "cnlSCnBhcmFtZXRlcnMSOgoIY29udGVudHMYBSABKAsyHi5pbmZlcmVuY2UuSW5mZXJUZW5zb3JDb250ZW50c1IIY29u"
    "dGVudHMaWAoPUGFyYW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZhbHVlGAIgASgLMhkuaW5mZXJlbmNl"
    "LkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEaWAoPUGFyYW1ldGVyc0VudHJ5EhAKA2tleRgBIAEoCVIDa2V5Ei8KBXZh"
    "bHVlGAIgASgLMhkuaW5mZXJlbmNlLkluZmVyUGFyYW1ldGVyUgV2YWx1ZToCOAEiugEKGE1vZGVsUmVwb3NpdG9yeVBh"
    "cmFtZXRlchIfCgpib29sX3BhcmFtGAEgASgISABSCWJvb2xQYXJhbRIhCgtpbnQ2NF9wYXJhbRgCIAEoA0gAUgppbnQ2"
    "NFBhcmFtEiMKDHN0cmluZ19wYXJhbRgDIAEoCUgAUgtzdHJpbmdQYXJhbRIhCgtieXRlc19wYXJhbRgEIAEoDEgAUgpi"
    "eXRlc1BhcmFtQhIKEHBhcmFtZXRlcl9jaG9pY2UiVwoWUmVwb3NpdG9yeUluZGV4UmVxdWVzdBInCg9yZXBvc2l0b3J5"
    "X25hbWUYASABKAlSDnJlcG9zaXRvcnlOYW1lEhQKBXJlYWR5GAIgASgIUgVyZWFkeSLKAQoXUmVwb3NpdG9yeUluZGV4"
    "UmVzcG9uc2USRQoGbW9kZWxzGAEgAygLMi0uaW5mZXJlbmNlLlJlcG9zaXRvcnlJbmRleFJlc3BvbnNlLk1vZGVsSW5k"
    "ZXhSBm1vZGVscxpoCgpNb2RlbEluZGV4EhIKBG5hbWUYASABKAlSBG5hbWUSGAoHdmVyc2lvbhgCIAEoCVIHdmVyc2lv"
    "bhIUCgVzdGF0ZRgDIAEoCVIFc3RhdGUSFgoGcmVhc29uGAQgASgJUgZyZWFzb24inwIKGlJlcG9zaXRvcnlNb2RlbExv"
    "YWRSZXF1ZXN0EicKD3JlcG9zaXRvcnlfbmFtZRgBIAEoCVIOcmVwb3NpdG9yeU5hbWUSHQoKbW9kZWxfbmFtZRgCIAEo"
    "CVIJbW9kZWxOYW1lElUKCnBhcmFtZXRlcnMYAyADKAsyNS5pbmZlcmVuY2UuUmVwb3NpdG9yeU1vZGVsTG9hZFJlcXVl"
    "c3QuUGFyYW1ldGVyc0VudHJ5UgpwYXJhbWV0ZXJzGmIKD1BhcmFtZXRlcnNFbnRyeRIQCgNrZXkYASABKAlSA2tleRI5"
    "CgV2YWx1ZRgCIAEoCzIjLmluZmVyZW5jZS5Nb2RlbFJlcG9zaXRvcnlQYXJhbWV0ZXJSBXZhbHVlOgI4ASIdChtSZXBv"
    "c2l0b3J5TW9kZWxMb2FkUmVzcG9uc2UiowIKHFJlcG9zaXRvcnlNb2RlbFVubG9hZFJlcXVlc3QSJwoPcmVwb3NpdG9y"
    "eV9uYW1lGAEgASgJUg5yZXBvc2l0b3J5TmFtZRIdCgptb2RlbF9uYW1lGAIgASgJUgltb2RlbE5hbWUSVwoKcGFyYW1l"
    "dGVycxgDIAMoCzI3LmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxVbmxvYWRSZXF1ZXN0LlBhcmFtZXRlcnNFbnRyeVIK"
    "cGFyYW1ldGVycxpiCg9QYXJhbWV0ZXJzRW50cnkSEAoDa2V5GAEgASgJUgNrZXkSOQoFdmFsdWUYAiABKAsyIy5pbmZl"
    "cmVuY2UuTW9kZWxSZXBvc2l0b3J5UGFyYW1ldGVyUgV2YWx1ZToCOAEiHwodUmVwb3NpdG9yeU1vZGVsVW5sb2FkUmVz"
    "cG9uc2UyrgYKFEdSUENJbmZlcmVuY2VTZXJ2aWNlEksKClNlcnZlckxpdmUSHC5pbmZlcmVuY2UuU2VydmVyTGl2ZVJl"
    "cXVlc3QaHS5pbmZlcmVuY2UuU2VydmVyTGl2ZVJlc3BvbnNlIgASTgoLU2VydmVyUmVhZHkSHS5pbmZlcmVuY2UuU2Vy"
    "dmVyUmVhZHlSZXF1ZXN0Gh4uaW5mZXJlbmNlLlNlcnZlclJlYWR5UmVzcG9uc2UiABJLCgpNb2RlbFJlYWR5EhwuaW5m"
    "ZXJlbmNlLk1vZGVsUmVhZHlSZXF1ZXN0Gh0uaW5mZXJlbmNlLk1vZGVsUmVhZHlSZXNwb25zZSIAElcKDlNlcnZlck1l"
    "dGFkYXRhEiAuaW5mZXJlbmNlLlNlcnZlck1ldGFkYXRhUmVxdWVzdBohLmluZmVyZW5jZS5TZXJ2ZXJNZXRhZGF0YVJl"
    "c3BvbnNlIgASVAoNTW9kZWxNZXRhZGF0YRIfLmluZmVyZW5jZS5Nb2RlbE1ldGFkYXRhUmVxdWVzdBogLmluZmVyZW5j"
    "ZS5Nb2RlbE1ldGFkYXRhUmVzcG9uc2UiABJLCgpNb2RlbEluZmVyEhwuaW5mZXJlbmNlLk1vZGVsSW5mZXJSZXF1ZXN0"
    "Gh0uaW5mZXJlbmNlLk1vZGVsSW5mZXJSZXNwb25zZSIAEloKD1JlcG9zaXRvcnlJbmRleBIhLmluZmVyZW5jZS5SZXBv"
    "c2l0b3J5SW5kZXhSZXF1ZXN0GiIuaW5mZXJlbmNlLlJlcG9zaXRvcnlJbmRleFJlc3BvbnNlIgASZgoTUmVwb3NpdG9y"
    "eU1vZGVsTG9hZBIlLmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxMb2FkUmVxdWVzdBomLmluZmVyZW5jZS5SZXBvc2l0"
    "b3J5TW9kZWxMb2FkUmVzcG9uc2UiABJsChVSZXBvc2l0b3J5TW9kZWxVbmxvYWQSJy5pbmZlcmVuY2UuUmVwb3NpdG9y"
    "eU1vZGVsVW5sb2FkUmVxdWVzdBooLmluZmVyZW5jZS5SZXBvc2l0b3J5TW9kZWxVbmxvYWRSZXNwb25zZSIAYgZwcm90"
    "bzM="
)

_POOL = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(_COMPILED)).file:
    _POOL.AddSerializedFile(_file.SerializeToString())


def methods() -> dict[str, tuple[type, type]]:
    """``{method name: (request class, response class)}`` of the service as the file declares it."""
    service = _POOL.FindServiceByName(SERVICE)
    return {
        method.name: (
            message_factory.GetMessageClass(method.input_type),
            message_factory.GetMessageClass(method.output_type),
        )
        for method in service.methods
    }
