// Atomic file writes: write to "<path>.tmp.<pid>", fsync, rename over path, fsync the directory.
// A process killed at any moment leaves either the old file or the new one, never a torn one.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fp {

// Throws fp::Error (naming the path and errno text) when any step fails; the temp file is removed.
void file_write_atomic(const std::string& path, std::string_view contents);
void file_write_atomic(const std::string& path, const void* data, size_t bytes);

// Whole file into a string; throws fp::Error naming the path when it cannot be read.
std::string file_read(const std::string& path);

}  // namespace fp
