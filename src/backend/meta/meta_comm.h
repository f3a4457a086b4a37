// The meta backend's data channel, counting (backend/meta/meta_comm.cpp).
#pragma once

#include <memory>

#include "comm/data_comm.h"

namespace fp {

// Rank `rank` of a group of `size`: moves nothing, counts every message on the log of the stream it is given.
std::unique_ptr<DataComm> data_comm_meta_counting(int rank, int size);

}  // namespace fp
