// tests/test_num.cpp - the number domain (interp/num.h).
#include <doctest/doctest.h>
