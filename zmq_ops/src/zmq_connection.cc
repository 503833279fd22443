// The ZMQ PULL connection resource (see zmq_connection.h).

#include "zmq_connection.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <set>

#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"

namespace feedbench {

absl::Status ToTf(const core::Status& s) {
  switch (s.code) {
    case core::Code::kOk:
      return absl::OkStatus();
    case core::Code::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case core::Code::kDeadlineExceeded:
      return absl::DeadlineExceededError(s.message);
    case core::Code::kCancelled:
      return absl::CancelledError(s.message);
    case core::Code::kUnavailable:
      return absl::UnavailableError(s.message);
    case core::Code::kResourceExhausted:
      return absl::ResourceExhaustedError(s.message);
    case core::Code::kInternal:
      break;
  }
  return absl::InternalError(s.message);
}

namespace {

// shm:// regions registered with CUDA where TensorFlow has loaded the CUDA runtime, so a slot (a zero-copy
// output) is copied to a GPU by DMA from page-locked memory, as the pinned outputs of the copying path
// are, instead of being staged through a bounce buffer. `cudaHostRegisterPortable`: pinned for every
// context, whichever GPU's tower reads it. Without a CUDA runtime in the process (a CPU machine) nothing
// is registered. Counted for `fb_tf_cuda_regions`.
using HostRegister = int (*)(void*, size_t, unsigned int);
using HostUnregister = int (*)(void*);
constexpr unsigned int kHostRegisterPortable = 1;
std::atomic<int64_t> g_registered{0};
std::atomic<int64_t> g_refused{0};

struct CudaRuntime {
  HostRegister reg = nullptr;
  HostUnregister unreg = nullptr;
};

const CudaRuntime& Runtime() {
  static const CudaRuntime rt = [] {
    for (const char* name : {"libcudart.so.12", "libcudart.so.13", "libcudart.so"}) {
      void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);  // only the one TensorFlow loaded
      if (h == nullptr) continue;
      CudaRuntime r{reinterpret_cast<HostRegister>(dlsym(h, "cudaHostRegister")),
                    reinterpret_cast<HostUnregister>(dlsym(h, "cudaHostUnregister"))};
      if (r.reg != nullptr && r.unreg != nullptr) return r;
    }
    return CudaRuntime{};
  }();
  return rt;
}

void RegisterRegion(void* base, uint64_t size, int mapped) {
  static std::mutex mu;
  static std::set<void*>* registered = new std::set<void*>();  // never destroyed: used until exit
  const CudaRuntime& rt = Runtime();
  if (rt.reg == nullptr) return;
  std::lock_guard<std::mutex> lock(mu);
  if (mapped) {
    if (rt.reg(base, size, kHostRegisterPortable) == 0) {
      registered->insert(base);
      ++g_registered;
    } else {
      ++g_refused;
    }
  } else if (registered->erase(base) > 0) {
    rt.unreg(base);
  }
}

}  // namespace

absl::Status ZmqConnection::Create(const ConnectionOptions& options, ZmqConnection** out) {
  *out = nullptr;
  if (options.num_threads < 1) return absl::InvalidArgumentError("num_threads must be >= 1");
  auto* conn = new ZmqConnection(options);
  conn->core_.SetMapHook(RegisterRegion);
  absl::Status s = ToTf(conn->core_.Open());
  if (!s.ok()) {
    conn->Unref();  // a ref-counted resource is released, never deleted
    return s;
  }
  conn->pool_ = std::make_unique<tensorflow::thread::ThreadPool>(tensorflow::Env::Default(), "zmq_pull",
                                                                 options.num_threads);
  *out = conn;
  return absl::OkStatus();
}

ZmqConnection::~ZmqConnection() {
  // Receives in flight see the close within one slice and return Cancelled;
  // destroying the pool waits for them (and runs any still queued), so no
  // receive thread touches the socket after this point. core_ is destroyed
  // after this body, closing the socket.
  core_.BeginClose();
  pool_.reset();
}

absl::Status ZmqConnection::Receive(Message* msg, tensorflow::CancellationManager* cancel) {
  std::function<bool()> cancelled;
  if (cancel != nullptr) cancelled = [cancel] { return cancel->IsCancelled(); };
  return ToTf(core_.Receive(msg, cancelled));
}

}  // namespace feedbench

// (regions registered, regions refused) with CUDA in this process so far: read by zmq_ops.tf_op.cuda_regions.
extern "C" __attribute__((visibility("default"))) void fb_tf_cuda_regions(int64_t* out) {
  out[0] = feedbench::g_registered.load();
  out[1] = feedbench::g_refused.load();
}
