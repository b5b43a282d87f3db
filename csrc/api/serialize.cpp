// torch.save-compatible files from C++ without TorchScript type tags (see
// mixprec/serialize.h): torch::pickle_save's recipe with a Pickler whose
// tag_aggregates is off.
#include "mixprec/serialize.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#ifndef _WIN32
#include <fcntl.h>
#include <unistd.h>
#endif

namespace mixprec {

namespace {

// Typed containers are pickled with TorchScript helpers
// (torch.jit._pickle.build_tensorlist, build_intlist...) that
// weights_only=True refuses: rebuild them as plain lists/dicts of Any.
c10::IValue plain(const c10::IValue& v) {
  if (v.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(plain(e));
    }
    return out;
  }
  if (v.isGenericDict()) {
    const auto dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), c10::AnyType::get());
    for (const auto& e : dict) {
      out.insert(e.key(), plain(e.value()));
    }
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elems;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      elems.push_back(plain(e));
    }
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  return v;
}

}  // namespace

std::vector<char> pickle_save(const c10::IValue& value_in) {
  const c10::IValue value = plain(value_in);
  std::vector<char> pickle_data;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t size) {
        pickle_data.insert(pickle_data.end(), buf, buf + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> container;
  container.reserve(pickle_data.size());
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* data, size_t len) -> size_t {
        const char* bytes = static_cast<const char*>(data);
        container.insert(container.end(), bytes, bytes + len);
        return len;
      });
  torch::jit::writeArchiveAndTensors("data", pickle_data.data(),
                                     pickle_data.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return container;
}

#ifndef _WIN32
namespace {

// write(2) all of `size` bytes, retrying short writes and EINTR.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

// Atomic: written beside `path`, fsync-ed, renamed onto it, the directory
// fsync-ed; `path` holds the previous file or the new one whenever the process
// dies, and a failed save leaves nothing behind.
void torch_save(const c10::IValue& value, const std::string& path) {
  const std::vector<char> bytes = pickle_save(value);
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string tmp = path + ".partial-" + std::to_string(::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  TORCH_CHECK(fd >= 0, "mixprec::torch_save: cannot open '", tmp,
              "' for writing (beside '", path, "'): ", std::strerror(errno));
  const bool written =
      write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int why = !written ? err : errno;
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "mixprec::torch_save: writing '", path,
                "' failed: ", std::strerror(why), " (the file is unchanged)");
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {  // (the rename made durable)
    ::fsync(dfd);
    ::close(dfd);
  }
}
#else
void torch_save(const c10::IValue& value, const std::string& path) {
  const std::vector<char> bytes = pickle_save(value);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out.good(), "mixprec::torch_save: cannot open '", path,
              "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  TORCH_CHECK(out.good(), "mixprec::torch_save: writing '", path, "' failed");
}
#endif

c10::IValue torch_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "mixprec::torch_load: cannot open '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  return torch::jit::pickle_load(bytes);
}

}  // namespace mixprec
