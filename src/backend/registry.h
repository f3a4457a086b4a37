// The backends a process has: each plug-in registers itself here, and the base names none of them.
//
// Note [Backends as plug-ins]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A backend is a library of its own (ggml's one library per backend): src/backend/cpu, src/backend/meta
// and src/backend/cuda each build one CMake target (fp_backend_cpu, fp_backend_meta, fp_backend_cuda),
// which holds its arenas, streams and kernels (the cpu kernels in backend/cpu/kernels, the cuda ones
// beside its backend). The base (src/backend: the Backend interface, the kernel table, host streams,
// this registry) and every layer above it (model, sched, step, train, plan) name no plug-in: they
// create a backend by name through backend_create (backend/backend.h), which finds it here, and they
// call kernels only through its table. The build holds this (Note [Layers the build enforces] in
// CMakeLists.txt): a layer above the base that includes a plug-in's header or calls into it does not
// link.
//
// Each plug-in defines `void backend_register_<name>()`, which calls backend_register once. The build
// writes the list of plug-ins it compiled (backends_builtin.cpp in the build folder, from CMakeLists.txt's
// FLATPEAK_BACKENDS) into an object that every program linking flatpeak_engine carries, and that object
// registers them before main. A backend the build left out (cuda without nvcc) is then simply not
// registered, and asking for it is an error that lists the ones that are.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/kernels.h"

namespace fp {

struct BackendEntry {
  std::string name;     // what --device takes: "cpu", "meta", "cuda"
  std::string summary;  // one line: what it computes and with what (errors and --help list it)
  // A backend with these capacities in bytes (kUnlimitedBytes for none); throws fp::Error when the
  // backend cannot run on this machine (cuda without a GPU).
  std::unique_ptr<Backend> (*create)(uint64_t device_capacity, uint64_t host_capacity) = nullptr;
  // Its kernel table, without making the backend (the host queries: workspace sizes, work measures;
  // `bench kernels`).
  const ops::Kernels& (*kernels)() = nullptr;
};

// A BackendEntry::create for a backend class constructed from the two capacities.
template <class B>
std::unique_ptr<Backend> backend_make(uint64_t device_capacity, uint64_t host_capacity) {
  return std::make_unique<B>(device_capacity, host_capacity);
}

// Adds a backend. Asserts that its name is new and its functions are set.
void backend_register(BackendEntry entry);
// The backend registered under `name`, or null.
const BackendEntry* backend_find(std::string_view name);
// A registered backend's entry; fp::Error naming the registered ones when there is none by that name.
const BackendEntry& backend_get(std::string_view name);
// The registered backends in registration order.
std::vector<const BackendEntry*> backends_registered();

}  // namespace fp
