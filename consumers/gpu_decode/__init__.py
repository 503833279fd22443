"""The `gpu-decode` input path: producers send JPEG files' bytes, each rank decodes them on its device."""
