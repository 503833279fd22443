// Decoders for the zmq_ops and native wire formats (see wire_decode.h).

#include "wire_decode.h"

#include <cstring>
#include <sstream>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire formats are read as little-endian; this host is not"
#endif

namespace feedbench {
namespace wire {
namespace {

// Reads a fixed-size integer from a possibly unaligned position.
template <typename T>
T Read(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool Fail(WireError* err, std::string field, std::string message) {
  err->field = std::move(field);
  err->message = std::move(message);
  return false;
}

std::string TensorField(int i, const char* what) {
  return "tensor[" + std::to_string(i) + "]." + what;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t j = 0; j < shape.size(); ++j) s << (j ? ", " : "") << shape[j];
  s << "]";
  return s.str();
}

// Bytes needed by a tensor of `shape` and `itemsize`; false on overflow
// (no such message can be valid, since it could never be that long).
bool ByteCount(const std::vector<int64_t>& shape, size_t itemsize, uint64_t* out) {
  for (int64_t d : shape) {
    if (d == 0) {  // an empty tensor, however large its other dimensions
      *out = 0;
      return true;
    }
  }
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  if (n > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = n;
  return true;
}

// An empty tensor may still name dimensions no array can have, e.g.
// [0, 2^62, 2^62]; TensorFlow and numpy refuse such shapes later, so the
// decoder does now. True when the non-zero dimensions fit in 2^63 bytes.
bool EmptyShapeFits(const std::vector<int64_t>& shape, size_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (d != 0 && __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  return n <= static_cast<uint64_t>(INT64_MAX);
}

std::string TooLarge(const std::vector<int64_t>& shape) {
  return "dimensions " + ShapeString(shape) + " describe more than 2^63 bytes";
}

std::string SizeMismatch(const std::vector<int64_t>& shape, int dtype, bool ok, uint64_t expected) {
  std::ostringstream s;
  s << "shape " << ShapeString(shape) << " x " << ItemSize(dtype) << "-byte " << DtypeName(dtype);
  if (ok) {
    s << " = " << expected;
  } else {
    s << " is more than 2^63 bytes";
  }
  return s.str();
}

// The dtype code and ndim of tensor `i`, as read from either format's header; `strings`: the
// format carries byte-string tensors (the native one, not the zmq_ops format).
bool CheckDtypeAndNdim(int i, int32_t dtype, int32_t ndim, bool strings, WireError* err) {
  if (dtype == kBytesDtype && strings) {
    if (ndim != 1) {
      return Fail(err, TensorField(i, "ndim"), "a byte-string tensor has 1 dimension, not " + std::to_string(ndim));
    }
    return true;
  }
  if (ItemSize(dtype) == 0) {
    return Fail(err, TensorField(i, "dtype"), "unknown dtype code " + std::to_string(dtype));
  }
  if (ndim < 0 || ndim > kMaxNdim) {
    return Fail(err, TensorField(i, "ndim"), std::to_string(ndim) + " is outside 0.." + std::to_string(kMaxNdim));
  }
  return true;
}

// Reads tensor `i`'s `ndim` dimensions, stored as D (int32 in the zmq_ops
// format, int64 in the native one); the caller has checked they are in bounds.
template <typename D>
bool ReadShape(const char* p, int i, int32_t ndim, std::vector<int64_t>* shape, WireError* err) {
  for (int j = 0; j < ndim; ++j) {
    const D d = Read<D>(p + sizeof(D) * j);
    if (d < 0) {
      return Fail(err, TensorField(i, "shape[") + std::to_string(j) + "]", "negative dimension " + std::to_string(d));
    }
    shape->push_back(d);
  }
  return true;
}

// A byte-string tensor's frame: its table of n lengths fits, and they add up to the bytes after it.
bool CheckByteStrings(int i, uint64_t n, const Frame& f, WireError* err) {
  uint64_t table = 0;
  if (__builtin_mul_overflow(n, uint64_t{8}, &table) || table > f.size) {
    return Fail(err, TensorField(i, "lengths"),
                "frame has " + std::to_string(f.size) + " bytes, its length table needs 8 x " + std::to_string(n));
  }
  uint64_t total = 0;
  for (uint64_t k = 0; k < n; ++k) {
    if (__builtin_add_overflow(total, Read<uint64_t>(f.data + 8 * k), &total)) {
      return Fail(err, TensorField(i, "lengths"), "the lengths add up to more than 2^64 bytes");
    }
  }
  if (total != f.size - table) {
    return Fail(err, TensorField(i, "lengths"),
                "the " + std::to_string(n) + " lengths add up to " + std::to_string(total) + " bytes, the frame holds " +
                    std::to_string(f.size - table) + " after its table");
  }
  return true;
}

std::string Printable(const char* p, size_t n) {
  std::ostringstream s;
  s << "b'";
  for (size_t k = 0; k < n; ++k) {
    unsigned char c = static_cast<unsigned char>(p[k]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      s << static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      s << "\\x" << hex[c >> 4] << hex[c & 15];
    }
  }
  s << "'";
  return s.str();
}

}  // namespace

size_t ItemSize(int dtype) {
  switch (dtype) {
    case 1: return 4;   // float32
    case 2: return 8;   // float64
    case 3: return 4;   // int32
    case 4: return 1;   // uint8
    case 5: return 2;   // int16
    case 6: return 1;   // int8
    case 9: return 8;   // int64
    case 10: return 1;  // bool
    case 17: return 2;  // uint16
    case 19: return 2;  // float16
    case 22: return 4;  // uint32
    case 23: return 8;  // uint64
    default: return 0;
  }
}

const char* DtypeName(int dtype) {
  switch (dtype) {
    case 1: return "float32";
    case 2: return "float64";
    case 3: return "int32";
    case 4: return "uint8";
    case 5: return "int16";
    case 6: return "int8";
    case 9: return "int64";
    case 10: return "bool";
    case 17: return "uint16";
    case 19: return "float16";
    case 22: return "uint32";
    case 23: return "uint64";
    case kBytesDtype: return "bytes";
    default: return "unknown";
  }
}

bool IsNative(const std::vector<Frame>& frames) {
  if (frames.size() > 1) return true;
  return !frames.empty() && frames[0].size >= 4 && std::memcmp(frames[0].data, kNativeMagic, 4) == 0;
}

bool DecodeZmqOps(const Frame& frame, std::vector<TensorView>* out, WireError* err) {
  const char* buf = frame.data;
  const size_t size = frame.size;
  out->clear();
  if (size < 4) {
    return Fail(err, "n_tensors", "message is " + std::to_string(size) + " bytes, too short for the tensor count");
  }
  const int32_t n = Read<int32_t>(buf);
  if (n < 0 || n > kMaxTensors) {
    return Fail(err, "n_tensors", std::to_string(n) + " is outside 0.." + std::to_string(kMaxTensors));
  }
  size_t off = 4;
  out->reserve(n);
  for (int i = 0; i < n; ++i) {
    const std::string at = "truncated at byte " + std::to_string(off) + " of " + std::to_string(size);
    if (size - off < 8) return Fail(err, TensorField(i, "dtype"), at);
    TensorView t;
    t.dtype = Read<int32_t>(buf + off);
    const int32_t ndim = Read<int32_t>(buf + off + 4);
    off += 8;
    if (!CheckDtypeAndNdim(i, t.dtype, ndim, false, err)) return false;
    if (size - off < 4 * static_cast<size_t>(ndim) + 8) {
      return Fail(err, TensorField(i, "shape"),
                  "truncated at byte " + std::to_string(off) + " of " + std::to_string(size));
    }
    if (!ReadShape<int32_t>(buf + off, i, ndim, &t.shape, err)) return false;
    off += 4 * static_cast<size_t>(ndim);
    const int64_t nbytes = Read<int64_t>(buf + off);
    off += 8;
    uint64_t expected = 0;
    const bool fits = ByteCount(t.shape, ItemSize(t.dtype), &expected);
    if (!fits || nbytes < 0 || static_cast<uint64_t>(nbytes) != expected) {
      return Fail(err, TensorField(i, "nbytes"),
                  std::to_string(nbytes) + " does not match " + SizeMismatch(t.shape, t.dtype, fits, expected));
    }
    if (expected > size - off) {
      return Fail(err, TensorField(i, "data"),
                  "needs " + std::to_string(expected) + " bytes, only " + std::to_string(size - off) + " left");
    }
    if (expected == 0 && !EmptyShapeFits(t.shape, ItemSize(t.dtype))) {
      return Fail(err, TensorField(i, "shape"), TooLarge(t.shape));
    }
    t.data = buf + off;
    t.nbytes = expected;
    off += expected;
    out->push_back(std::move(t));
  }
  if (off != size) {
    return Fail(err, "message",
                std::to_string(size - off) + " trailing bytes after " + std::to_string(n) + " tensors");
  }
  return true;
}

bool DecodeNativeHeader(const Frame& frame, const char* magic, NativeHeader* header, std::vector<TensorView>* out,
                        WireError* err) {
  out->clear();
  const char* buf = frame.data;
  const size_t size = frame.size;
  if (size < kNativeFixedSize) {
    return Fail(err, "header",
                std::to_string(size) + " bytes, shorter than the " + std::to_string(kNativeFixedSize) +
                    "-byte fixed part");
  }
  if (std::memcmp(buf, magic, 4) != 0) {
    return Fail(err, "magic", Printable(buf, 4) + " is not b'" + std::string(magic, 4) + "'");
  }
  const uint16_t version = Read<uint16_t>(buf + 4);
  if (version != kNativeVersion) {
    return Fail(err, "version",
                "unknown header version " + std::to_string(version) + " (this build reads " +
                    std::to_string(kNativeVersion) + ")");
  }
  const uint16_t n = Read<uint16_t>(buf + 6);
  if (n > kMaxTensors) {
    return Fail(err, "n_tensors", std::to_string(n) + " > " + std::to_string(kMaxTensors));
  }
  header->producer_id = Read<uint32_t>(buf + 8);
  header->seq = Read<uint64_t>(buf + 12);
  header->send_time_ns = Read<int64_t>(buf + 20);
  const uint32_t extras_len = Read<uint32_t>(buf + 28);

  size_t off = kNativeFixedSize;
  out->reserve(n);
  for (int i = 0; i < n; ++i) {
    if (size - off < 8) {
      return Fail(err, TensorField(i, "dtype"),
                  "header truncated at byte " + std::to_string(off) + " of " + std::to_string(size));
    }
    TensorView t;
    t.dtype = Read<int32_t>(buf + off);
    const int32_t ndim = Read<int32_t>(buf + off + 4);
    off += 8;
    if (!CheckDtypeAndNdim(i, t.dtype, ndim, true, err)) return false;
    if (t.dtype == kBytesDtype && std::memcmp(magic, kNativeMagic, 4) != 0) {
      return Fail(err, TensorField(i, "dtype"), "byte strings in a shm:// slot are read by the Python consumer only");
    }
    if (size - off < 8 * static_cast<size_t>(ndim)) {
      return Fail(err, TensorField(i, "shape"),
                  "header truncated at byte " + std::to_string(off) + " of " + std::to_string(size));
    }
    if (!ReadShape<int64_t>(buf + off, i, ndim, &t.shape, err)) return false;
    off += 8 * static_cast<size_t>(ndim);
    out->push_back(std::move(t));
  }
  if (static_cast<uint64_t>(extras_len) != size - off) {
    return Fail(err, "extras_len",
                std::to_string(extras_len) + " does not match the " + std::to_string(size - off) +
                    " bytes left in the header");
  }
  // The msgpack extras are producer telemetry; the op does not need them.
  return true;
}

bool TensorBytes(const TensorView& t, uint64_t* nbytes) {
  const bool fits = ByteCount(t.shape, ItemSize(t.dtype), nbytes);
  return fits && (*nbytes != 0 || EmptyShapeFits(t.shape, ItemSize(t.dtype)));
}

bool DecodeNative(const std::vector<Frame>& frames, size_t total_frames, NativeHeader* header,
                  std::vector<TensorView>* out, WireError* err) {
  out->clear();
  if (frames.empty() || total_frames == 0) return Fail(err, "frames", "empty message");
  if (!DecodeNativeHeader(frames[0], kNativeMagic, header, out, err)) return false;
  const size_t n = out->size();

  if (total_frames != static_cast<size_t>(n) + 1) {
    return Fail(err, "frames",
                "header declares " + std::to_string(n) + " tensors but " + std::to_string(total_frames - 1) +
                    " data frames arrived");
  }
  if (frames.size() < n + 1) {  // the receiver keeps every frame a valid message can have; never trust it
    return Fail(err, "frames",
                "header declares " + std::to_string(n) + " tensors but only " + std::to_string(frames.size()) +
                    " frames were kept");
  }
  for (size_t i = 0; i < n; ++i) {
    TensorView& t = (*out)[i];
    const Frame& f = frames[i + 1];
    if (t.dtype == kBytesDtype) {  // its size is its length table's, not its shape's
      if (!CheckByteStrings(static_cast<int>(i), static_cast<uint64_t>(t.shape[0]), f, err)) return false;
      t.data = f.data;
      t.nbytes = f.size;
      continue;
    }
    uint64_t expected = 0;
    const bool fits = ByteCount(t.shape, ItemSize(t.dtype), &expected);
    if (!fits || f.size != expected) {
      return Fail(err, TensorField(i, "nbytes"),
                  "frame has " + std::to_string(f.size) + " bytes, " + SizeMismatch(t.shape, t.dtype, fits, expected));
    }
    if (expected == 0 && !EmptyShapeFits(t.shape, ItemSize(t.dtype))) {
      return Fail(err, TensorField(i, "shape"), TooLarge(t.shape));
    }
    t.data = f.data;
    t.nbytes = f.size;
  }
  return true;
}

bool DecodeMessage(const std::vector<Frame>& frames, size_t total_frames, bool* is_native,
                   NativeHeader* header, std::vector<TensorView>* out, WireError* err) {
  *is_native = total_frames > 1 || IsNative(frames);
  if (*is_native) return DecodeNative(frames, total_frames, header, out, err);
  if (frames.empty()) return Fail(err, "frames", "empty message");
  return DecodeZmqOps(frames[0], out, err);
}

}  // namespace wire
}  // namespace feedbench
